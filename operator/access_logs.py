"""Fetch the node agents' sampled access logs (anchorage-trace/v1) for tuning, from the
sources the operator trusts with its token.

A node agent serves its access log only behind the operator's token (it holds every
sampled tenant's sessions and tool arguments): each URL is fetched with ``Authorization:
Bearer <token>``, the token from ``ANCHORAGE_ACCESS_LOG_TOKEN`` (the chart's Secret).
Reading never empties a node agent's buffer (draining is a POST this module never sends).
Records from all sources are merged by timestamp and the most recent ``max_requests`` kept.

The rule (issue 41; the ecosystem review found ``spec.tuning.accessLogs`` took any URL or
file, so whoever may write a policy could have the token sent to a server of theirs, or
have the operator read its own files). An entry of ``spec.tuning.accessLogs`` is accepted
only when it is one of:

- ``http://<service>[.<policy's namespace>[.svc[.cluster.local]]]:<port>/v1/access-log``
  (or ``/access-log``; no user, query or fragment) where, in the policy's namespace,
  Service ``<service>`` is a node-agent Service of the chart (labels
  ``app.kubernetes.io/part-of: anchorage``, ``app.kubernetes.io/component: model``; type
  ClusterIP), selects exactly the pods of the policy's ``targetRef`` (its selector equals
  the target's scale selector: a Service without one could have hand-written endpoints
  anywhere) and ``<port>`` is its port named ``access-log``. The operator then fetches
  that Service's ClusterIP, never the host name as written (a bare name would resolve in
  the operator's own namespace, ``localhost`` to its own pod);
- a file inside the directory the operator was started with (``--access-log-dir``, a volume
  its administrator mounted; none by default: then no file is read).

``source_problems`` (the shape, pure) runs with the spec's other checks (a violation is
``Degraded`` / ``InvalidSpec``); ``service_problems`` (pure, on the Service and the target's
selector the adapter reads) runs before each fetch: a refused source is never fetched
(``AccessLogsTrusted`` False, a ``AccessLogRejected`` event).
"""

from __future__ import annotations

import os
import re
import tempfile
import urllib.parse
from dataclasses import dataclass
from typing import Any

import httpx

from anchorage.trace.format import TraceError, TraceRecord, read_trace


class AccessLogError(RuntimeError):
    pass


def _read(path: str) -> list[TraceRecord]:
    try:
        return read_trace(path)[1]
    except TraceError as e:
        raise AccessLogError(str(e)) from None
    except OSError as e:
        raise AccessLogError(f"cannot read access log {path}: {e.strerror or e}") from None


ENV_TOKEN = "ANCHORAGE_ACCESS_LOG_TOKEN"
# The chart's node-agent Services (charts/anchorage/templates/models.yaml: the model Service
# with its `access-log` port).
SERVICE_LABELS = {"app.kubernetes.io/part-of": "anchorage", "app.kubernetes.io/component": "model"}
PORT_NAME = "access-log"
PATHS = ("/v1/access-log", "/access-log")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class ServiceSource:
    """An access-log URL of a Service in the policy's namespace."""
    url: str
    service: str
    port: int
    path: str

    def fetch_url(self, service: dict[str, Any]) -> str:
        """The URL the operator fetches: the checked Service's own address."""
        ip = str(service["clusterIP"])
        return f"http://{f'[{ip}]' if ':' in ip else ip}:{self.port}{self.path}"


def parse_source(src: str, namespace: str, file_dir: str | None
                 ) -> tuple[ServiceSource | None, str | None]:
    """(the Service it names, None) for an accepted URL, (None, None) for an accepted
    file, (None, why) otherwise."""
    if not src.startswith("http://"):
        if src.startswith("https://"):
            return None, f"{src!r}: the node agents serve their access log on http"
        if not file_dir:
            return None, (f"{src!r} is a file; the operator reads no files (it was started "
                          "without --access-log-dir); use the node agents' Service URL")
        root = os.path.realpath(file_dir)
        real = os.path.realpath(src)
        if os.path.commonpath([root, real]) != root:
            return None, f"{src!r} is outside the operator's --access-log-dir"
        return None, None
    u = urllib.parse.urlsplit(src)
    want = (f"http://<service>[.{namespace}[.svc[.cluster.local]]]:<port>/v1/access-log, "
            "a node-agent Service of this policy's namespace")
    if u.username is not None or u.password is not None or u.query or u.fragment \
            or u.path not in PATHS:
        return None, f"{src!r} is not {want}"
    try:
        port = u.port
    except ValueError:
        port = None
    labels = (u.hostname or "").split(".")
    host_ok = labels and all(_LABEL.match(x) for x in labels) and (
        len(labels) == 1 or (labels[1] == namespace and labels[2:] in ([], ["svc"],
                                                                         ["svc", "cluster", "local"])))
    if not port or not host_ok:
        return None, f"{src!r} is not {want}"
    return ServiceSource(src, labels[0], port, u.path), None


def source_problems(sources: list[str], namespace: str, file_dir: str | None) -> list[str]:
    """The shape rule of the module's spec, for ``spec.tuning.accessLogs``."""
    out = []
    for i, src in enumerate(sources or []):
        _, why = parse_source(str(src), namespace, file_dir)
        if why:
            out.append(f"tuning.accessLogs[{i}]: {why}")
    return out


def _selector(text: str) -> dict[str, str] | None:
    """A scale subresource's selector (``a=b,c=d``; set-based terms: None)."""
    out = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        k, sep, v = term.partition("=")
        if not sep or v.startswith("=") or k.endswith("!") or " " in k:
            return None
        out[k] = v
    return out or None


def service_problems(src: ServiceSource, service: dict[str, Any] | None,
                     target_selector: str | None) -> list[str]:
    """Why ``src`` is not a node-agent Service of the policy's target (the module's spec).
    ``service``: {labels, type, clusterIP, selector, ports: [{name, port}]} or None (not
    found);
    ``target_selector``: the target's scale selector (None: no target)."""
    where = f"{src.url!r}: Service {src.service}"
    if service is None:
        return [f"{where} not found in the policy's namespace"]
    labels = service.get("labels") or {}
    if any(labels.get(k) != v for k, v in SERVICE_LABELS.items()):
        return [f"{where} is not a node-agent Service of the chart (labels "
                + ", ".join(f"{k}={v}" for k, v in SERVICE_LABELS.items()) + ")"]
    if (service.get("type") or "ClusterIP") != "ClusterIP" or not service.get("selector") \
            or service.get("clusterIP") in (None, "", "None"):
        return [f"{where} is not a ClusterIP Service with a selector"]
    want = _selector(target_selector or "")
    if want is None or dict(service["selector"]) != want:
        return [f"{where} does not select the pods of the policy's targetRef"]
    ports = [p.get("port") for p in service.get("ports") or [] if p.get("name") == PORT_NAME]
    if src.port not in ports:
        return [f"{where} has no port {src.port} named {PORT_NAME}"]
    return []


def load_access_logs(sources: list[str], *, max_requests: int, timeout_s: float = 30.0,
                     token: str | None = None) -> list[TraceRecord]:
    """``token``: the node agents' access-log token (None: ``ANCHORAGE_ACCESS_LOG_TOKEN``)."""
    token = (os.environ.get(ENV_TOKEN, "") if token is None else token).strip()
    headers = {"authorization": f"Bearer {token}"} if token else {}
    records: list[TraceRecord] = []
    for src in sources:
        if src.startswith(("http://", "https://")):
            try:
                resp = httpx.get(src, timeout=timeout_s, headers=headers)
                resp.raise_for_status()
            except httpx.HTTPError as e:
                raise AccessLogError(f"cannot fetch access log {src}: {e}") from None
            suffix = ".jsonl.gz" if resp.content[:2] == b"\x1f\x8b" else ".jsonl"
            with tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False) as fh:
                fh.write(resp.content)
            try:
                records += _read(fh.name)
            finally:
                os.unlink(fh.name)
        else:
            records += _read(src)
    records.sort(key=lambda r: r.timestamp)
    return records[-max_requests:]
