"""Fixtures of the chart's end-to-end test on a real single-node cluster
(scripts/cluster/node.py) inside a network namespace this test creates: the host state
before, the node, the test's own thread moved into the namespace (its API and HTTP calls
reach node, pod and Service addresses, which exist only there), helm through a subprocess
in the namespace, and a real Prometheus on the node scraping through the chart's monitors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, need, need_module

sys.path.insert(0, str(REPO / "scripts" / "cluster"))
import netns  # noqa: E402
import node as nodemod  # noqa: E402

from tests.cluster import monitors  # noqa: E402

RELEASE, NAMESPACE = "anc", "llm"
CPU_VALUES = REPO / "charts" / "anchorage" / "ci" / "cpu-values.yaml"
PROM_PORT = 9090
TIMES: dict[str, float] = {}
REPORT = Path(os.environ.get("ANCHORAGE_CLUSTER_REPORT",
                             Path.home() / ".cache" / "anchorage" / "logs" / "cluster-e2e.json"))


class Timer:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        TIMES[self.name] = round(time.monotonic() - self.t0, 1)


def base_values() -> dict:
    """cpu-values.yaml plus what this environment decides: where Prometheus is (the node,
    no cluster DNS), a short scrape interval, every session in the access logs."""
    import images as cluster_images

    from tests.chart.conftest import overlay

    # The chart has no default image repository (the images are not published): the ones
    # scripts/cluster/images.py loads into the node's docker (pullPolicy Never there).
    v = overlay(cluster_images.chart_image_values(), yaml.safe_load(CPU_VALUES.read_text()))
    v["monitoring"] = {"prometheusURL": f"http://{netns.NODE_IP}:{PROM_PORT}",
                       "scrapeInterval": "5s"}
    v.setdefault("nodeAgent", {})["accessLogSampleRate"] = 1.0
    return v


@pytest.fixture(scope="module")
def host_before():
    if os.environ.get("ANCHORAGE_CLUSTER") == "0":
        # an explicit opt-out for a quick local run; `make test` and CI run it
        pytest.skip("the chart on a real single-node cluster: left out (ANCHORAGE_CLUSTER=0)")
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow end-to-end test (a Kubernetes node, three vLLM pods): set ANCHORAGE_SLOW=1")
    need_module("kubernetes")
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    gone = nodemod.missing()
    need(not gone, "single-node cluster prerequisites: " + "; ".join(gone),
         "run `make test` (scripts/setup.d/30-k8s.sh and 35-cluster.sh install them)")
    need(Path("/usr/bin/prometheus").exists(), "prometheus (apt)", "scripts/setup.d/40-prometheus.sh")
    return netns.snapshot()


@pytest.fixture(scope="module")
def node(tmp_path_factory, host_before):
    n = nodemod.Node(tmp_path_factory.mktemp("node"))
    try:
        with Timer("cluster_up_incl_image_load"):
            info = n.up()
    except BaseException:
        n.down()
        raise
    TIMES.update({f"load:{i['ref']}": i["seconds"] for i in info["images"] if i["loaded"]})
    yield n, info
    n.down()
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(TIMES, indent=1))


@pytest.fixture(scope="module")
def inside(node):
    """The test's main thread in the node's network namespace for the module's tests."""
    n, _ = node
    ctx = nodemod.in_netns(n.ns)
    ctx.__enter__()
    ctx.inside = True
    yield ctx
    if ctx.inside:
        ctx.__exit__(None, None, None)


@pytest.fixture(scope="module")
def api(node, inside):
    from kubernetes import client, config

    n, _ = node
    c = client.ApiClient(config.new_client_from_config(str(n.kubeconfig)).configuration)
    ext = client.ApiextensionsV1Api(c)
    for plural, kind in monitors.CRDS:   # so the chart's `auto` monitors render
        ext.create_custom_resource_definition(monitors.crd(plural, kind))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        names = {c.metadata.name for c in ext.list_custom_resource_definition().items
                 if any(cond.type == "Established" and cond.status == "True"
                        for cond in (c.status.conditions or []))}
        if all(f"{p}.monitoring.coreos.com" in names for p, _ in monitors.CRDS):
            break
        time.sleep(1)
    return c


def helm(node, action: str, values: dict | None = None) -> dict:
    n, _ = node
    args = [action, str(n.kubeconfig), RELEASE, NAMESPACE]
    if values is not None:
        f = n.w / f"values-{action}-{time.monotonic_ns()}.json"
        f.write_text(json.dumps(values))
        args.append(str(f))
    p = subprocess.run(["nsenter", f"--net={n.ns}", "--", sys.executable, "-m",
                        "tests.cluster.helmcli", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, f"helm {action} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1] or "{}")


class Prometheus:
    """Prometheus 2.42 on the node (in the namespace, on the node address so pods reach
    it), configured from the monitor objects the chart created."""

    def __init__(self, n, api) -> None:
        self.n, self.api, self.proc = n, api, None
        self.dir = n.w / "prometheus"
        self.url = f"http://{netns.NODE_IP}:{PROM_PORT}"

    def objects(self) -> dict[str, list[dict]]:
        from kubernetes import client

        co = client.CustomObjectsApi(self.api)
        return {kind: co.list_namespaced_custom_object("monitoring.coreos.com", "v1", NAMESPACE,
                                                       plural)["items"]
                for plural, kind in monitors.CRDS}

    def start(self) -> "Prometheus":
        self.dir.mkdir(exist_ok=True)
        objs = self.objects()
        sd_dir = self.dir / "sd"
        sd_dir.mkdir(exist_ok=True)
        namespaces = monitors.namespaces(objs)
        monitors.discover(self.api, namespaces, sd_dir)
        # The discovery stand-in (Debian's Prometheus has no kubernetes_sd): a thread started
        # here, in the node's network namespace like this one, rewrites the target files.
        self._stop = threading.Event()
        self._sd = threading.Thread(target=self._discover, args=(namespaces, sd_dir), daemon=True)
        self._sd.start()
        (self.dir / "rules.yml").write_text(yaml.safe_dump(monitors.rule_groups(objs["PrometheusRule"])))
        cfg = monitors.prometheus_config(objs, str(sd_dir), [str(self.dir / "rules.yml")])
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        log = open(self.dir / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net={self.n.ns}", "--", "/usr/bin/prometheus",
             f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address={netns.NODE_IP}:{PROM_PORT}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.started = time.time()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200:
                    return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("prometheus not ready:\n" + (self.dir / "prometheus.log").read_text()[-2000:])

    def _discover(self, namespaces: list[str], sd_dir: Path) -> None:
        while not self._stop.wait(3):
            try:
                monitors.discover(self.api, namespaces, sd_dir)
            except Exception as exc:   # noqa: BLE001 - the files keep the last targets
                self.sd_error = repr(exc)

    def query(self, expr: str) -> list[dict]:
        from urllib.parse import urlencode

        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urlencode({'query': expr})}",
                                    timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 5.0) -> list[dict]:
        """The series ``expr`` has between ``start`` and ``end`` (what a Grafana panel draws
        over its time range)."""
        from urllib.parse import urlencode

        q = urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                       "step": f"{step_s:g}s"})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{q}", timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if getattr(self, "_sd", None) is not None:
            self._stop.set()
            self._sd.join(30)
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
