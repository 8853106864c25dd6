"""The access-log token goes only to the policy's own node agents (issue 41): through the
operator's handler code path (``handlers._pass``, what kopf's handlers and the periodic pass
run) against kmock's API emulator, with a loopback HTTP server standing for every address a
policy could name. Whoever may write an AgentCachePolicy could otherwise have the token
sent to a server of theirs, or the operator read its own files."""

from __future__ import annotations

import http.server
import re
import threading

import kmock
import pytest
import yaml
from kubernetes import client

from anchorage.operator.kube import KubeIO
from tests.operator.test_reconcile_kmock import CALM, Emulator, StubMetrics

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=Emulator)]

NS = "llm"
TOKEN = "the-access-log-token-" + "x" * 27
POD_LABELS = {"app.kubernetes.io/name": "anchorage", "app.kubernetes.io/instance": "anc",
              "app.kubernetes.io/component": "model", "anchorage.dev/model": "m"}


class Listener:
    """A loopback HTTP server serving a recorded access log; records who asked, with which
    Authorization header."""

    def __init__(self, body: bytes):
        self.calls: list[tuple[str, str]] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.calls.append((self.path, self.headers.get("authorization", "")))
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def listener(tmp_path):
    from tests.operator.access_log import write_access_log

    srv = Listener(write_access_log(tmp_path / "served.jsonl").read_bytes())
    yield srv
    srv.close()


@pytest.fixture
def handlers(kmock, monkeypatch):
    from anchorage.operator import handlers as h

    cfg = client.Configuration()
    cfg.host = str(kmock.url).rstrip("/")
    io = KubeIO(client.ApiClient(cfg))
    monkeypatch.setattr(h, "_kube", io)
    monkeypatch.setattr(h, "_metrics_for", lambda url: StubMetrics(CALM))
    monkeypatch.setenv("ANCHORAGE_ACCESS_LOG_TOKEN", TOKEN)
    monkeypatch.delenv("ANCHORAGE_OPERATOR_ACCESS_LOG_DIR", raising=False)
    kmock.objects["apps/v1/deployments", NS, "anc-anchorage-m"] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "anc-anchorage-m", "namespace": NS, "resourceVersion": "1"},
        "spec": {"replicas": 2, "selector": {"matchLabels": POD_LABELS}},
        "status": {"replicas": 2, "selector": ",".join(f"{k}={v}" for k, v in POD_LABELS.items())}}
    yield h
    io.api.close()


def service(name: str, port: int, *, labels=None, selector=None, cluster_ip="127.0.0.1",
            type_="ClusterIP") -> dict:
    """A Service as the chart renders a model's (its labels, its pods, the access-log
    port); the ClusterIP is the loopback listener, so an accepted source is really fetched."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"app.kubernetes.io/part-of": "anchorage", **POD_LABELS}
                         if labels is None else labels},
            "spec": {"type": type_, "clusterIP": cluster_ip,
                     "selector": POD_LABELS if selector is None else selector,
                     "ports": [{"name": "http", "port": 8000},
                               {"name": "access-log", "port": port}]}}


def body(access_logs: list[str]) -> dict:
    return {"metadata": {"name": "anc-anchorage-m", "namespace": NS, "uid": "u-1", "generation": 1},
            "spec": {"targetRef": {"kind": "Deployment", "name": "anc-anchorage-m"},
                     "policy": {"name": "hybrid", "parameters": {"survivalThreshold": 0.3,
                                                                 "horizon": 120}},
                     "autoscaling": {"enabled": False}, "replicas": 2,
                     "metrics": {"prometheusURL": "http://127.0.0.1:9"},
                     "tuning": {"enabled": True, "intervalSeconds": 600, "accessLogs": access_logs,
                                "capacityBlocks": 180, "minImprovement": 0.01,
                                "parameters": [{"name": "survivalThreshold", "min": 0.05,
                                                "max": 0.8, "steps": 6}]}},
            "status": {}}


def cond(status, type_):
    return next((c for c in status.get("conditions", []) if c["type"] == type_), None)


async def run(handlers, b):
    import asyncio

    return await asyncio.to_thread(handlers._pass, b)


async def test_the_chart_node_agent_service_of_the_target_gets_the_token(kmock, handlers, listener):
    kmock.objects["v1/services", NS, "anc-anchorage-m"] = service("anc-anchorage-m", listener.port)
    for host in ("anc-anchorage-m", f"anc-anchorage-m.{NS}", f"anc-anchorage-m.{NS}.svc",
                 f"anc-anchorage-m.{NS}.svc.cluster.local"):
        listener.calls.clear()
        status, events = await run(handlers, body([f"http://{host}:{listener.port}/v1/access-log"]))
        assert cond(status, "AccessLogsTrusted")["status"] == "True", status
        # fetched at the Service's own address, with the token
        assert listener.calls == [("/v1/access-log", f"Bearer {TOKEN}")]
        assert status["parametersSource"] == "tuner", status.get("lastTuningReason")


@pytest.mark.parametrize("src, needle", [
    ("http://127.0.0.1:{port}/v1/access-log", "is not http://<service>"),
    ("http://anc-anchorage-m.other:{port}/v1/access-log", "is not http://<service>"),
    ("http://anc-anchorage-m.other.svc:{port}/v1/access-log", "is not http://<service>"),
    ("http://evil.example.com:{port}/v1/access-log", "is not http://<service>"),
    ("http://user:pw@anc-anchorage-m:{port}/v1/access-log", "is not http://<service>"),
    ("http://anc-anchorage-m:{port}/v1/access-log?drain=1", "is not http://<service>"),
    ("http://anc-anchorage-m:{port}/metrics", "is not http://<service>"),
    ("https://anc-anchorage-m:{port}/v1/access-log", "serve their access log on http"),
    ("/var/run/secrets/kubernetes.io/serviceaccount/token", "the operator reads no files"),
])
async def test_any_other_address_or_a_file_is_refused_and_never_fetched(handlers, listener, src, needle):
    status, _ = await run(handlers, body([src.format(port=listener.port)]))
    c = cond(status, "Degraded")
    assert c["status"] == "True" and c["reason"] == "InvalidSpec", status
    assert "tuning.accessLogs[0]" in c["message"] and needle in c["message"], c["message"]
    assert listener.calls == []


@pytest.mark.parametrize("what, svc, needle", [
    ("missing", None, "not found in the policy's namespace"),
    ("not the chart's", dict(labels={"app": "x"}), "is not a node-agent Service of the chart"),
    ("other pods", dict(selector={"app": "mine"}), "does not select the pods of the policy's targetRef"),
    # no selector: its Endpoints are whatever its writer wrote
    ("no selector", dict(selector={}), "is not a ClusterIP Service with a selector"),
    ("external name", dict(type_="ExternalName", cluster_ip=None), "is not a ClusterIP Service"),
    ("another port", dict(port_offset=1), "has no port"),
])
async def test_a_service_that_is_not_the_targets_node_agents_is_refused(kmock, handlers, listener,
                                                                       what, svc, needle):
    if svc is not None:
        svc = dict(svc)
        port = listener.port + svc.pop("port_offset", 0)
        kmock.objects["v1/services", NS, "lookalike"] = service("lookalike", port, **svc)
    status, events = await run(handlers, body([f"http://lookalike:{listener.port}/v1/access-log"]))
    c = cond(status, "AccessLogsTrusted")
    assert c["status"] == "False" and c["reason"] == "UntrustedAccessLog" and needle in c["message"], status
    assert status["lastTuningReason"].startswith("tuning failed: refused"), status
    assert any(e.reason == "AccessLogRejected" for e in events)
    assert listener.calls == []
    # the rest of the pass went on: the ConfigMap is written, the spec's parameters in force
    assert status["parametersSource"] == "spec" and status["configGeneration"] == 1
    assert kmock.objects["v1/configmaps", NS, "anc-anchorage-m-anchorage"]


async def test_files_only_inside_the_operators_access_log_dir(handlers, monkeypatch, tmp_path):
    from tests.operator.access_log import write_access_log

    logs = tmp_path / "logs"
    logs.mkdir()
    log = write_access_log(logs / "a.jsonl")
    secret = tmp_path / "secret.jsonl"
    secret.write_text("not for policies\n")
    status, _ = await run(handlers, body([str(log)]))
    assert "the operator reads no files" in cond(status, "Degraded")["message"]
    monkeypatch.setenv("ANCHORAGE_OPERATOR_ACCESS_LOG_DIR", str(logs))
    status, _ = await run(handlers, body([str(logs / ".." / "secret.jsonl")]))
    assert "outside the operator's --access-log-dir" in cond(status, "Degraded")["message"]
    status, _ = await run(handlers, body([str(log)]))
    assert cond(status, "Degraded")["status"] == "False"
    assert status["parametersSource"] == "tuner", status.get("lastTuningReason")


async def test_the_crd_pattern_refuses_what_is_never_a_node_agent_address():
    """The CRD's pattern turns the plainly wrong entries away at admission (the operator's
    rule, above, decides the rest)."""
    from tests.conftest import REPO

    crd = yaml.safe_load((REPO / "manifests/crd/agentcachepolicies.anchorage.dev.yaml").read_text())
    items = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["tuning"]["properties"]["accessLogs"]["items"]
    pat = re.compile(items["pattern"])
    for ok in ("http://anc-anchorage-m.llm.svc:9401/v1/access-log", "/mnt/logs/a.jsonl"):
        assert pat.match(ok), ok
    for bad in ("https://attacker.example/collect", "http://attacker.example/v1/access-log",
                "http://h:1/v1/access-log?x=1", "file:///etc/passwd", "relative.jsonl"):
        assert not pat.match(bad), bad
