"""`helm install` for real: the chart with charts/anchorage/ci/cpu-values.yaml on a
single-node Kubernetes 1.20 (scripts/cluster/node.py, inside a network namespace this test
creates), pods from the project's images (scripts/cluster/images.py), a real Prometheus
scraping through the chart's monitors. The tests run in order and share one release:

1. install: operator, router, two engine pods with the node-agent sidecar, every pod Ready,
   the router Ready before any engine (its readiness does not wait for them);
2. Prometheus scrapes every component through the chart's PodMonitor/ServiceMonitors;
3. `anchorage drive` through the router's Service: every request succeeds, hit rate from
   the engines' own counters, each agent thread of a session stays on one replica;
4. the model's AgentCachePolicy edited, as a chart-owned policy is (its values and
   `helm upgrade`; docs/chart.md, "Changing a policy"): the operator (its pod, its RBAC)
   patches the ConfigMap, node agents and router apply it (their metrics) with no traffic,
   then the operator scales the Deployment on the hit-rate signal it reads from Prometheus
   and the router routes to the new pod;
5. an engine pod deleted under non-streaming load: every request succeeds, the
   replacement is discovered;
6. `helm upgrade` with a changed router value (and the policy values of 4) rolls the router
   without a failed request;
7. every dashboard panel the CPU build can feed draws data from that Prometheus over the
   test's time range (CPU_UNFED, OFF_BY_DEFAULT and EVENT_ONLY say which cannot, and why);
8. `helm uninstall` leaves no AgentCachePolicy stuck on a finalizer;
9. the node torn down leaves the host as found (links, routes, iptables, sysctls, mounts,
   cgroups, /var/log/pods and the other paths kubelet writes).

Part of `make test` and CI (ANCHORAGE_CLUSTER=0 leaves it out; `make test-cluster` runs only
it; see docs/chart.md for the measured cold and warm times).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import httpx
import pytest

from tests.cluster.conftest import (NAMESPACE, RELEASE, REPO, TIMES, Prometheus, Timer,
                                    base_values, helm, netns)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
FULL = f"{RELEASE}-anchorage"
MODEL_DEPLOY = f"{FULL}-tiny"
SEL = {c: f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={c}"
       for c in ("operator", "router", "model")}
GROUP, VERSION, PLURAL = "anchorage.dev", "v1alpha1", "agentcachepolicies"


def wait_for(pred, what: str, timeout_s: float = 300.0, every_s: float = 2.0):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as exc:   # noqa: BLE001 - reported on timeout
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s" + (f" (last error: {last!r})" if last else ""))


def pods(api, component: str):
    from kubernetes import client

    return [p for p in client.CoreV1Api(api).list_namespaced_pod(
        NAMESPACE, label_selector=SEL[component]).items if p.metadata.deletion_timestamp is None]


def ready_since(pod):
    for c in pod.status.conditions or []:
        if c.type == "Ready" and c.status == "True":
            return c.last_transition_time
    return None


def metrics(url: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series(m: dict, name: str, **labels) -> list[float]:
    return [v for (n, ls), v in m.items() if n == name and all((k, w) in ls for k, w in labels.items())]


def router_url(api) -> str:
    from kubernetes import client

    svc = client.CoreV1Api(api).read_namespaced_service(f"{FULL}-router", NAMESPACE)
    return f"http://{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"


def router_pod_url(api) -> str:
    return f"http://{pods(api, 'router')[0].status.pod_ip}:8000"


def healthy_replicas(api) -> set[str]:
    m = metrics(router_pod_url(api) + "/metrics")
    return {dict(ls).get("replica", "") for (n, ls), v in m.items()
            if n == "anchorage_router_replica_healthy" and v == 1.0}


def engine_ips(api) -> list[str]:
    return sorted(p.status.pod_ip for p in pods(api, "model") if ready_since(p))


def completion(url: str, session: str, rng: random.Random, stream: bool = False,
               prefix_tokens: int = 0) -> httpx.Response:
    """Random token ids; with ``prefix_tokens``, after the session's own fixed prefix of
    that length (what its next request reuses)."""
    own = random.Random(session)
    prompt = ([own.randrange(3, 1000) for _ in range(prefix_tokens)]
              + [rng.randrange(3, 1000) for _ in range(rng.randrange(64, 400))])
    return httpx.post(url + "/v1/completions", timeout=120, headers={"x-session-id": session},
                      json={"model": "tiny", "prompt": prompt, "max_tokens": 4, "stream": stream})


class Load:
    """Non-streaming completions from ``workers`` threads until stopped; every outcome kept.
    ``prefix_tokens``: each session's requests share a prefix of that length."""

    def __init__(self, url: str, workers: int = 3, sessions: int = 6, prefix_tokens: int = 0) -> None:
        self.url, self.workers, self.sessions = url, workers, sessions
        self.prefix_tokens = prefix_tokens
        self.results: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _run(self, i: int) -> None:
        rng = random.Random(i)
        while not self._stop.is_set():
            try:
                r = completion(self.url, f"load-{rng.randrange(self.sessions)}", rng,
                               prefix_tokens=self.prefix_tokens)
                ok = r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
                self.results.append((r.status_code, "" if ok else r.text[:200]))
            except Exception as exc:   # noqa: BLE001 - every failure is recorded
                self.results.append((0, repr(exc)[:200]))

    def __enter__(self):
        # Threads created here inherit this thread's network namespace.
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(150)

    def failures(self) -> list:
        return [r for r in self.results if r[0] != 200 or r[1]]


# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def release(node, api):
    VALUES.clear()
    VALUES.update(base_values())
    with Timer("helm_install"):
        helm(node, "install", VALUES)
    t0 = time.monotonic()
    yield t0


@pytest.fixture(scope="module")
def prom(node, api, release):
    n, _ = node
    wait_for(lambda: len(Prometheus(n, api).objects()["PodMonitor"]) == 1, "the chart's PodMonitor", 60)
    p = Prometheus(n, api).start()
    yield p
    p.stop()


def test_1_install_every_pod_ready_router_first(api, release):
    def all_ready():
        ops, routers, engines = pods(api, "operator"), pods(api, "router"), pods(api, "model")
        return (len(ops) == 2 and len(routers) == 1 and len(engines) == 2
                and all(ready_since(p) for p in ops + routers + engines))

    wait_for(all_ready, "operator x2, router, two engine pods Ready", 900, 5)
    TIMES["install_to_all_ready"] = round(time.monotonic() - release, 1)
    router_ready = ready_since(pods(api, "router")[0])
    first_engine = min(ready_since(p) for p in pods(api, "model"))
    assert router_ready < first_engine, (
        f"router Ready at {router_ready}, first engine at {first_engine}: the router's readiness "
        "waited for the engines")
    for p in pods(api, "model"):
        assert {c.name for c in p.spec.containers} == {"vllm", "node-agent"}
        assert all(s.ready for s in p.status.container_statuses)


def test_2_prometheus_scrapes_through_the_chart_monitors(prom):
    def up():
        r = prom.query('up == 1')
        return {(s["metric"].get("container"), s["metric"].get("endpoint")) for s in r}

    want = {("vllm", "http"), ("node-agent", "agent"), ("router", "http"), ("operator", "metrics")}
    wait_for(lambda: want <= up(), f"targets up: {want}", 120, 3)
    # Both engines' own counters, each from its pod (a target found later is scraped later).
    q = f'vllm:prefix_cache_queries_total{{namespace="{NAMESPACE}",model_name="tiny"}}'
    agents = 'up{container="node-agent"} == 1'
    wait_for(lambda: len({s["metric"]["pod"] for s in prom.query(q)}) == 2
             and len({s["metric"]["pod"] for s in prom.query(agents)}) == 2,
             "both engines' prefix-cache counters and both node agents", 120, 3)


def _access_log_threads(api) -> dict[tuple[str, int], Counter]:
    """(session, first block key) -> requests per pod, from every node agent's access log
    (sample rate 1): the agent policy's thread is (session, agent), and an agent's prompts
    all start with its anchor, so the first block names the agent."""
    import base64

    from kubernetes import client

    # Its own port, behind the token only the operator holds (the chart's Secret): read as
    # the operator's tuning reads it.
    secret = client.CoreV1Api(api).read_namespaced_secret(f"{FULL}-access-log", NAMESPACE)
    auth = {"Authorization": "Bearer " + base64.b64decode(secret.data["token"]).decode()}
    out: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for p in pods(api, "model"):
        r = httpx.get(f"http://{p.status.pod_ip}:9401/v1/access-log", headers=auth, timeout=10)
        assert r.status_code == 200, (r.status_code, r.text[:200])
        text = r.text
        for line in text.splitlines()[1:]:
            rec = json.loads(line)
            if rec.get("session_id") is not None and rec.get("hash_ids"):
                out[(str(rec["session_id"]), rec["hash_ids"][0])][p.metadata.name] += 1
    return out


def test_3_workload_through_the_router_service(node, api, prom, tmp_path):
    n, _ = node
    url = router_url(api)
    engines = ",".join(f"http://{ip}:8000" for ip in engine_ips(api))
    with Timer("drive"):
        p = subprocess.run(["nsenter", f"--net={n.ns}", "--", sys.executable, "-m", "anchorage.cli",
                            "drive", "--router-url", url, "--engine-urls", engines, "--model", "tiny",
                            "--agents", "4", "--sessions", "16", "--mean-requests", "5",
                            "--concurrency", "4", "--max-sessions", "4", "--max-prompt-tokens", "3000",
                            "--time-compression", "200", "--out", str(tmp_path)],
                           cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = json.loads((tmp_path / "report.json").read_text())
    s = next(iter(summary["summaries"].values())) if "summaries" in summary else summary["run"]
    assert s["requests"] >= 40 and s["failed"] == 0, s["errors"]
    assert s["hit_rate_engines"] is not None and s["hit_rate_engines"] > 0.2, s
    # Agent routing: a known thread goes to the replica holding its history unless that
    # replica is overloaded by more than the thread's re-prefill work (routing/agent.py).
    results = [json.loads(line) for line in (tmp_path / "results-run.jsonl").read_text().splitlines()]
    threads = _access_log_threads(api)
    assert {r["session"] for r in results} <= {s for s, _ in threads}, "sessions missing from the access logs"
    requests = sum(sum(c.values()) for c in threads.values())
    moved = sum(sum(c.values()) - max(c.values()) for c in threads.values())
    TIMES["drive_threads"], TIMES["drive_thread_moves"] = len(threads), moved
    assert requests >= s["requests"] * 0.9
    assert moved <= 0.1 * requests, f"{moved} of {requests} requests left their thread's replica"
    assert len({p for c in threads.values() for p in c}) == 2, "one replica got no traffic"
    TIMES["drive_requests"] = s["requests"]
    TIMES["drive_hit_rate_engines"] = round(s["hit_rate_engines"], 3)


# The release's values: base_values() at install, then each upgrade's (test 4's policy
# edits stay in force in test 6's upgrade, as they would in a values file).
VALUES: dict = {}


def _acp(api):
    from kubernetes import client

    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, MODEL_DEPLOY)


def _merge(into: dict, over: dict) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _edit_policy(node, what: str, spec: dict) -> None:
    """Edit the chart's AgentCachePolicy the way its owner does: the model's
    ``agentCachePolicy.spec`` values and ``helm upgrade`` (a kubectl edit of a field the
    chart sets is a server-side apply conflict at the next upgrade; docs/chart.md)."""
    model = VALUES["models"][0]
    _merge(model.setdefault("agentCachePolicy", {}).setdefault("spec", {}), spec)
    with Timer(f"helm_upgrade_{what}"):
        helm(node, "upgrade", VALUES)


def test_4_policy_edit_reaches_agents_and_router_then_scales(node, api, prom):
    from kubernetes import client

    core = client.CoreV1Api(api)
    cm_name = f"{MODEL_DEPLOY}-anchorage"
    cms = [c for c in core.list_namespaced_config_map(NAMESPACE).items
           if c.metadata.name.startswith(MODEL_DEPLOY)]
    assert cms, "the operator wrote no ConfigMap for the model"
    cm_name = cms[0].metadata.name
    before_rv = cms[0].metadata.resource_version

    def generations():
        sidecars = [max(series(metrics(f"http://{ip}:9400/metrics"), "anchorage_config_generation") or [0])
                    for ip in engine_ips(api)]
        router = max(series(metrics(router_pod_url(api) + "/metrics"),
                            "anchorage_router_config_generation") or [0])
        return sidecars, router

    side0, router0 = generations()
    _edit_policy(node, "policy", {"policy": {"name": "lru"}, "routing": {"policy": "session"}})
    wait_for(lambda: core.read_namespaced_config_map(cm_name, NAMESPACE).metadata.resource_version
             != before_rv, "the operator patched the ConfigMap", 120)
    try:
        wait_for(lambda: all(g > max(side0) for g in generations()[0]) and generations()[1] > router0,
                 "node agents and router apply the new document", 240, 5)
    except AssertionError as exc:
        doc = core.read_namespaced_config_map(cm_name, NAMESPACE).data or {}
        raise AssertionError(f"{exc}; before: sidecars {side0}, router {router0}; now "
                             f"{generations()}; ConfigMap {cm_name}: "
                             f"{ {k: v[:300] for k, v in doc.items()} }") from None
    # Behaviour: the engines' policy and the router's routing policy changed.
    for ip in engine_ips(api):
        m = metrics(f"http://{ip}:9400/metrics")
        assert series(m, "anchorage_policy_info", policy="lru"), "node agent still on the old policy"
    url, rng = router_url(api), random.Random(4)
    for i in range(6):
        assert completion(url, f"s{i}", rng).status_code == 200
    m = metrics(router_pod_url(api) + "/metrics")
    assert sum(series(m, "anchorage_router_requests_total", policy="session")) >= 6

    # Scaling on the hit-rate signal: a target the current hit rate misses but winning back
    # the capacity misses would reach (scaling.py, rule 3), read as the operator reads it.
    from anchorage.operator.prometheus import PrometheusClient

    pc = PrometheusClient(prom.url)
    sel = f'namespace="{NAMESPACE}",model_name="tiny"'
    # Sessions whose prefixes (64 x 384 tokens) outgrow the two engines' KV pools (2 x 256
    # blocks of 32 tokens): hits, and misses a third replica's capacity would win back.
    with Load(url, workers=4, sessions=64, prefix_tokens=384) as load:
        time.sleep(60)   # a window (60 s, the operator's too below) of this load only
        sig = wait_for(lambda: (s := pc.fleet_signals(selector=sel, window_s=60, replicas=2,
                                                      block_size=32))
                       and s.hit_rate is not None and s.capacity_miss_rate > 0.01 and s,
                       "hit rate and capacity misses in Prometheus", 300, 5)
        target = round(min(0.99, sig.hit_rate + sig.capacity_miss_rate / 2), 3)
        _edit_policy(node, "autoscaling", {"metrics": {"windowSeconds": 60}, "autoscaling": {
            "targetHitRate": target, "maxQueueDepth": 1000, "maxKvUsage": 1.0,
            "scaleUpStabilizationSeconds": 10, "cooldownSeconds": 10, "maxReplicas": 3}})
        apps = client.AppsV1Api(api)
        wait_for(lambda: apps.read_namespaced_deployment(MODEL_DEPLOY, NAMESPACE).spec.replicas == 3,
                 f"operator scaled to 3 (signals {sig}, target {target})", 300, 5)
    wait_for(lambda: len(engine_ips(api)) == 3, "third engine pod Ready", 600, 5)
    wait_for(lambda: len(healthy_replicas(api)) == 3, "router routes to three replicas", 180, 5)
    assert not load.failures(), load.failures()[:5]
    status = _acp(api).get("status", {})
    assert status, "the operator recorded no status"


def test_5_engine_pod_deleted_mid_workload(api):
    from kubernetes import client

    core = client.CoreV1Api(api)
    before = {p.metadata.name for p in pods(api, "model")}
    victim = sorted(before)[0]
    with Load(router_url(api), workers=3) as load:
        wait_for(lambda: len(load.results) >= 10, "load running", 120, 1)
        core.delete_namespaced_pod(victim, NAMESPACE, grace_period_seconds=0)
        wait_for(lambda: len({p.metadata.name for p in pods(api, "model")
                              if ready_since(p)} - before) >= 1, "replacement pod Ready", 600, 5)
        n0 = len(load.results)
        wait_for(lambda: len(load.results) >= n0 + 10, "load after the replacement", 180, 1)
    assert len(load.results) >= 20
    assert not load.failures(), f"{len(load.failures())} of {len(load.results)} failed: {load.failures()[:5]}"
    new_ips = set(engine_ips(api))
    wait_for(lambda: {f"http://{ip}:8000" for ip in new_ips} <= healthy_replicas(api)
             or new_ips <= {r.split("//")[-1].split(":")[0] for r in healthy_replicas(api)}
             or len(healthy_replicas(api)) == len(new_ips),
             "the router discovered the replacement", 180, 5)


def test_6_upgrade_rolls_router_without_dropping(node, api):
    from kubernetes import client

    old = {p.metadata.name for p in pods(api, "router")}
    values = VALUES
    values["router"]["retries"] = 3
    with Load(router_url(api), workers=2) as load:
        with Timer("helm_upgrade"):
            helm(node, "upgrade", values)
        wait_for(lambda: (rs := pods(api, "router")) and not ({p.metadata.name for p in rs} & old)
                 and all(ready_since(p) for p in rs), "router rolled to a new pod", 600, 3)
        n0 = len(load.results)
        wait_for(lambda: len(load.results) >= n0 + 5, "requests through the new router", 120, 1)
    args = client.AppsV1Api(api).read_namespaced_deployment(f"{FULL}-router", NAMESPACE) \
        .spec.template.spec.containers[0].args
    assert "--retries=3" in args
    assert not load.failures(), f"{len(load.failures())} of {len(load.results)} failed: {load.failures()[:5]}"


# Panels whose series a CPU node cannot produce, and why (docs/metrics.md: the series are
# absent, not zero, without their component).
_HOST_COPIES = ("temporal tiering: its host copies need vLLM's offload connector, "
                "CUDA/XPU only (node_agent/tiering.py)")
_HOST_TIER = "the host tier: vLLM's offloading connector, CUDA/XPU only (docs/host-tier.md)"
CPU_UNFED: dict[str, str] = {
    "policy/Offloads and reloads": _HOST_COPIES,
    "policy/KV bytes moved to and from host": _HOST_COPIES,
    "policy/Prompt tokens from host memory": _HOST_TIER,
    "policy/Host reloads, stores and fallbacks": _HOST_TIER,
    "policy/Host tier bytes": _HOST_TIER,
    "policy/Host occupancy": _HOST_TIER,
    "policy/Host tier capacity": _HOST_TIER,
}
# Panels of features the chart's defaults (and cpu-values.yaml) leave off; the CPU build
# can feed them once enabled.
OFF_BY_DEFAULT: dict[str, str] = {
    "policy/Reserved blocks per agent": "spatial tiering (modelDefaults.tiering, default off)",
    "policy/Tuning runs": "tuning (the policy's spec.tuning.enabled, default false; the "
                          "operator's tuning is tested in tests/operator)",
    "policy/Node pool": "the node pool (hostTier.nodePool, default off, with the host tier; "
                        "two real engines share one in tests/node_agent/"
                        "test_host_tier_engine.py)",
}
# Panels of events this test's workloads do not cause (their series appear with the first
# event): every request of tests 3-6 must succeed, and the node agents issue no warm-up for
# them (no agent is predicted with enough confidence).
EVENT_ONLY: dict[str, str] = {
    "router/Rejected (429) and errors": "a 429 or a failed request",
    "router/Retries": "an attempt retried on another replica (test 5's deletion may drain "
                      "without one)",
    "policy/Wasted warm-ups": "a warm-up used or wasted",
}


def test_7_dashboard_panels_return_data(prom):
    """Every panel draws something over the test's time range (a Grafana panel is a range
    query over its dashboard's time range, 3 h here): at least one of its queries has
    samples since Prometheus started, with the workloads, the edit, the pod deletion and the
    roll of tests 3-6 in that range."""
    from tests.chart.test_dashboards import DASHBOARDS, _load, _substitute, _targets

    time.sleep(15)   # a few scrapes after the last traffic
    end = time.time()
    empty = []
    for name in DASHBOARDS:
        panels: dict[str, list[str]] = defaultdict(list)
        for title, expr, _ in _targets(_load(name)):
            panels[title].append(expr)
        for title, exprs in panels.items():
            if f"{name}/{title}" in {**CPU_UNFED, **OFF_BY_DEFAULT, **EVENT_ONLY}:
                continue
            if not any(prom.query_range(_substitute(e), prom.started, end) for e in exprs):
                empty.append(f"{name}/{title}: " + " | ".join(exprs))
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_8_uninstall_leaves_no_stuck_policy(node, api):
    from kubernetes import client

    with Timer("helm_uninstall"):
        helm(node, "uninstall")
    co = client.CustomObjectsApi(api)
    wait_for(lambda: co.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"] == [],
             "AgentCachePolicies gone (none stuck on a finalizer)", 120)
    wait_for(lambda: not client.AppsV1Api(api).list_namespaced_deployment(NAMESPACE).items,
             "the release's Deployments gone", 120)


def test_9_teardown_leaves_host_as_found(node, host_before, prom, inside):
    n, _ = node
    prom.stop()
    inside.__exit__(None, None, None)   # back on the host: its state is what is compared
    inside.inside = False
    with Timer("teardown"):
        problems = n.down()
    assert not problems, problems
    diff = netns.diff(host_before, netns.snapshot())
    assert not diff, "the host changed:\n" + "\n".join(diff)
