"""kopf handlers for AgentCachePolicy: create, spec update and resume run one ``reconcile``
pass, and so does the periodic resync (``anchorage.operator.resync``, every interval); the
result is patched into ``status`` and posted as Events.

Run with ``anchorage operator`` (or ``kopf run -m anchorage.operator.handlers``). Several
replicas may run: kopf peering (``--peering``, default ``anchorage``) keeps one active.
Environment: ``ANCHORAGE_OPERATOR_INTERVAL_S`` (resync period, default 15 s),
``ANCHORAGE_OPERATOR_METRICS_PORT`` (the operator's own /metrics; unset or 0: not served),
``ANCHORAGE_OPERATOR_PEERING_LIFETIME_S`` (how long a silent peer counts as alive, i.e. how
soon a standby replica takes over from a killed active one; kopf's default 60 s),
``ANCHORAGE_OPERATOR_NAMESPACES`` (comma-separated namespaces watched; empty: all).

Finalizers: none. The periodic pass is the operator's own loop, not a kopf timer, because
kopf puts a finalizer on every object a timer serves, and a policy deleted together with
the operator (``helm uninstall``, a namespace deletion) then stays Terminating forever
(see ``resync``). A finalizer an earlier version left on a policy is taken off by kopf
the first time it sees that policy (no handler requires one).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf

from anchorage.operator import metrics as op_metrics
from anchorage.operator import resync
from anchorage.operator.kube import KubeIO
from anchorage.operator.prometheus import PrometheusClient
from anchorage.operator.reconcile import reconcile
from anchorage.operator.resync import GROUP, PLURAL, VERSION
INTERVAL_S = float(os.environ.get("ANCHORAGE_OPERATOR_INTERVAL_S", "15"))

_kube: KubeIO | None = None
_prom: dict[str, PrometheusClient] = {}
_resync: resync.Resync | None = None


@kopf.on.login()
def login(**kw: Any) -> kopf.ConnectionInfo | None:
    # kopf's own readers (not the kubernetes client's, which fixes $KUBECONFIG at import).
    info = kopf.login_with_service_account(**kw)
    if info is None:
        return kopf.login_with_kubeconfig(**kw)
    return dataclasses.replace(info, server=in_cluster_server(os.environ) or info.server)


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The API server's URL from the address every pod is given (what client-go and the
    kubernetes client use): kopf's service-account login names it by cluster DNS
    (kubernetes.default.svc), which a cluster without DNS, or a pod with another dnsPolicy,
    cannot resolve. None outside a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _kube
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    _kube = KubeIO()
    port = int(os.environ.get("ANCHORAGE_OPERATOR_METRICS_PORT", "0") or 0)
    if port:
        op_metrics.serve(port, os.environ.get("ANCHORAGE_OPERATOR_METRICS_HOST", "127.0.0.1"))
    settings.posting.level = 20  # INFO and above become Events
    lifetime = os.environ.get("ANCHORAGE_OPERATOR_PEERING_LIFETIME_S")
    if lifetime:
        # keep-alives are sent every max(1, lifetime - 5..10) s, so >= 2 s leaves a margin
        settings.peering.lifetime = max(2, int(float(lifetime)))
    settings.watching.server_timeout = 60
    settings.background.instant_exit_timeout = 0.1
    start_resync(settings)


def start_resync(settings: kopf.OperatorSettings) -> None:
    """Start the periodic pass (``resync``) with kopf's final peering settings."""
    global _resync
    watched = os.environ.get("ANCHORAGE_OPERATOR_NAMESPACES", "")
    p = settings.peering
    _resync = resync.Resync(
        _kube.api, _periodic_pass, interval_s=INTERVAL_S,
        namespaces=tuple(n for n in watched.split(",") if n),
        peering=resync.Peering(name=p.name, standalone=p.standalone, mandatory=p.mandatory,
                               clusterwide=p.clusterwide, priority=p.priority,
                               identity=os.environ.get("POD_ID"))).start()


@kopf.on.cleanup()
def stop_resync(**_: Any) -> None:
    if _resync is not None:
        _resync.stop()


def _metrics_for(url: str) -> PrometheusClient:
    if url not in _prom:
        _prom[url] = PrometheusClient(url)
    return _prom[url]


def _pass(body: Mapping[str, Any]) -> tuple[dict[str, Any], list]:
    """One reconcile pass on ``body``: the status to merge and the Events to post."""
    meta = body["metadata"]
    spec = dict(body.get("spec") or {})
    with resync.lock_for(meta["uid"]):
        try:
            res = reconcile(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                            generation=meta.get("generation"), spec=spec,
                            status=dict(body.get("status") or {}), kube=_kube,
                            metrics_for=_metrics_for, now_s=time.time(),
                            access_log_dir=os.environ.get("ANCHORAGE_OPERATOR_ACCESS_LOG_DIR")
                            or None)
        except Exception:
            op_metrics.record_error(meta["namespace"], meta["name"])
            raise
    op_metrics.record(meta["namespace"], meta["name"], spec, res.status, res.facts)
    return res.status, res.events


def _periodic_pass(body: dict) -> tuple[dict[str, Any], list]:
    status, events = _pass(body)
    meta = body["metadata"]
    for ev in events:
        resync.log.info("[%s/%s] %s: %s", meta["namespace"], meta["name"], ev.reason,
                        ev.message)
    return status, events


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile_on_change(body: kopf.Body, patch: kopf.Patch, logger: Any, **_: Any) -> None:
    status, events = _pass(body)
    for k, v in status.items():
        patch.status[k] = v
    for ev in events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)
        logger.info("%s: %s", ev.reason, ev.message)
