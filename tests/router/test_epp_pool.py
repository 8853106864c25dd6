"""EPP discovery and leader election: the pure rules on recorded API objects, the
elector's race with optimistic concurrency, and both adapters against a real
kube-apiserver 1.20 on loopback (tests/support/k8s) with the Inference Extension's own
InferencePool CRD (tests/data/crds, v1.6.0)."""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from pathlib import Path

import pytest
import yaml

from anchorage.router.lease import LeaseElector, lease_step
from anchorage.router.pool import PoolSource, pod_ready, pool_endpoints, selector_string
from tests.conftest import need

pytestmark = pytest.mark.filterwarnings("ignore:Unverified HTTPS request")
CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"

# as the API returns them (trimmed of managedFields)
POOL = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "llama", "namespace": "llm", "resourceVersion": "812"},
        "spec": {"selector": {"matchLabels": {"app.kubernetes.io/instance": "anc",
                                              "anchorage.dev/model": "llama"}},
                 "targetPorts": [{"number": 8000}],
                 "endpointPickerRef": {"name": "anc-epp", "port": {"number": 9002}}}}


def pod(name, ip, ready=True, labels=None, deleting=False):
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": "llm", "uid": f"u-{name}",
                      "labels": labels if labels is not None else
                      {"app.kubernetes.io/instance": "anc", "anchorage.dev/model": "llama",
                       "pod-template-hash": "7f9"}},
         "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
         "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}] if ip else [],
                    "conditions": [{"type": "Initialized", "status": "True"},
                                   {"type": "Ready", "status": "True" if ready else "False"},
                                   {"type": "ContainersReady", "status": "True" if ready else "False"}]}}
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-12-07T22:00:00Z"
    return p


def test_pool_endpoints_are_the_ready_selected_pods_on_every_target_port():
    pods = [pod("a", "10.0.0.1"), pod("b", "10.0.0.2", ready=False), pod("c", "10.0.0.3", deleting=True),
            pod("d", ""), pod("e", "10.0.0.5", labels={"app.kubernetes.io/instance": "anc"}),
            pod("f", "fd00::6")]
    urls, names = pool_endpoints(POOL, pods)
    assert urls == ["http://10.0.0.1:8000", "http://[fd00::6]:8000"]
    assert names == {"http://10.0.0.1:8000": "a", "http://[fd00::6]:8000": "f"}
    two = copy.deepcopy(POOL)
    two["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8001}]
    assert pool_endpoints(two, pods[:1])[0] == ["http://10.0.0.1:8000", "http://10.0.0.1:8001"]
    assert selector_string(POOL["spec"]["selector"]["matchLabels"]) == \
        "anchorage.dev/model=llama,app.kubernetes.io/instance=anc"
    assert pod_ready(pods[0]) and not pod_ready(pods[1])
    bad = copy.deepcopy(POOL)
    bad["spec"]["targetPorts"] = []
    with pytest.raises(ValueError, match="targetPorts"):
        pool_endpoints(bad, pods)


class FakePoolAPI:
    def __init__(self, pool, pods):
        self.pool, self.pods = pool, pods
        self.events: queue.Queue = queue.Queue()

    def get_pool(self, ns, name):
        return copy.deepcopy(self.pool)

    def list_pods(self, ns, selector):
        return copy.deepcopy(self.pods), "1"

    def watch_pods(self, ns, selector, rv, timeout_s):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                yield self.events.get(timeout=0.05)
            except queue.Empty:
                continue


def test_pool_source_follows_pod_events_and_a_changed_pool():
    api = FakePoolAPI(POOL, [pod("a", "10.0.0.1")])
    src = PoolSource(api, "llm", "llama", pool_every_s=1)
    seen: queue.Queue = queue.Queue()
    t = threading.Thread(target=src.watch, args=(lambda u, n: seen.put(u),), daemon=True)
    t.start()
    try:
        assert seen.get(timeout=5) == ["http://10.0.0.1:8000"]
        api.events.put({"type": "ADDED", "object": pod("b", "10.0.0.2")})
        assert seen.get(timeout=5) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        api.events.put({"type": "MODIFIED", "object": pod("a", "10.0.0.1", ready=False)})
        assert seen.get(timeout=5) == ["http://10.0.0.2:8000"]
        api.pods = [pod("b", "10.0.0.2")]
        api.pool = copy.deepcopy(POOL)
        api.pool["spec"]["targetPorts"] = [{"number": 9000}]
        assert seen.get(timeout=5) == ["http://10.0.0.2:9000"]    # the next pool read
    finally:
        src.stop()


def test_lease_rule_acquire_renew_follow_take_over():
    act, spec = lease_step(None, "me", 1000.0, 15)
    assert act == "acquire" and spec["holderIdentity"] == "me" and spec["leaseTransitions"] == 0
    act, spec2 = lease_step(spec, "me", 1005.0, 15)
    assert act == "renew" and spec2["renewTime"] > spec["renewTime"]
    assert lease_step(spec2, "you", 1010.0, 15) == ("follow", None)
    act, spec3 = lease_step(spec2, "you", 1021.0, 15)          # expired at 1020
    assert act == "acquire" and spec3["holderIdentity"] == "you" and spec3["leaseTransitions"] == 1


class FakeLeaseAPI:
    """Optimistic concurrency as the API server does it: a write with a stale
    resourceVersion is a conflict."""

    def __init__(self):
        self.obj = None
        self.lock = threading.Lock()

    def get(self, ns, name):
        with self.lock:
            return copy.deepcopy(self.obj)

    def create(self, ns, name, spec):
        with self.lock:
            if self.obj is not None:
                raise RuntimeError("409 AlreadyExists")
            self.obj = {"metadata": {"resourceVersion": "1"}, "spec": spec}

    def replace(self, ns, name, rv, spec):
        with self.lock:
            if self.obj["metadata"]["resourceVersion"] != rv:
                raise RuntimeError("409 Conflict")
            self.obj = {"metadata": {"resourceVersion": str(int(rv) + 1)}, "spec": spec}


def test_two_electors_one_leader_and_a_take_over_when_it_stops_renewing():
    api = FakeLeaseAPI()
    a = LeaseElector(api, "llm", "llama-epp", "a", duration_s=3, renew_s=1)
    b = LeaseElector(api, "llm", "llama-epp", "b", duration_s=3, renew_s=1)
    # a takes the free lease; b finds it held and follows
    t = 100.0
    assert a.step(t) is True and b.step(t) is False
    for i in range(1, 3):
        assert a.step(t + i) and not b.step(t + i)
    # a stops renewing: b takes over once a's last renewal is older than the duration
    assert not b.step(t + 4.5)
    assert b.step(t + 5.5)
    assert api.obj["spec"]["holderIdentity"] == "b" and api.obj["spec"]["leaseTransitions"] == 1
    # a comes back: it follows, and reports the change
    changes = []
    a.on_change = changes.append
    assert a.step(t + 6) is False and changes == [False]


def test_a_leader_that_cannot_renew_steps_down_before_the_lease_expires():
    class Broken(FakeLeaseAPI):
        fail = False

        def get(self, ns, name):
            if self.fail:
                raise ConnectionError("API unreachable")
            return super().get(ns, name)
    api = Broken()
    a = LeaseElector(api, "llm", "l", "a", duration_s=3, renew_s=1)
    assert a.step(10.0)
    api.fail = True
    assert a.step(11.0)                 # one missed renewal: still within the lease
    assert not a.step(12.0)             # duration - renew since the last renewal: down


# -- against a real kube-apiserver ------------------------------------------------------
def crd_for_the_test_server() -> dict:
    """The vendored CRD as the test's 1.20 API server takes it: that server reads an
    empty-string ``default`` as null and rejects it (``endpointPickerRef.group``'s
    ``default: ""``; newer servers accept it); that default is dropped, nothing else."""
    crd = yaml.safe_load(CRD.read_text())

    def strip(node):
        if isinstance(node, dict):
            if node.get("default") == "":
                del node["default"]
            for v in node.values():
                strip(v)
        elif isinstance(node, list):
            for v in node:
                strip(v)
    strip(crd)
    return crd


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    from tests.support import k8s

    gone = k8s.missing()
    need(not gone, f"Kubernetes 1.20 binaries ({', '.join(gone)})", k8s.BUILD_HINT)
    c = k8s.LocalCluster(tmp_path_factory.mktemp("k8s-epp"), controller_manager=False).start()
    yield c
    c.stop()


def _client(kube):
    from kubernetes import client, config
    return config.new_client_from_config(str(kube.kubeconfig)), client


def test_pool_discovery_against_the_api_server(kube):
    from kubernetes.client.rest import ApiException

    from anchorage.router.pool import KubePoolAPI
    api_client, client = _client(kube)
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(crd_for_the_test_server())
    except ApiException as exc:
        if exc.status != 409:
            raise
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    for _ in range(100):              # the CRD is established
        try:
            custom.list_namespaced_custom_object("inference.networking.k8s.io", "v1", "default",
                                                 "inferencepools")
            break
        except ApiException:
            time.sleep(0.1)
    pool = copy.deepcopy(POOL)
    pool["metadata"] = {"name": "llama", "namespace": "default"}
    custom.create_namespaced_custom_object("inference.networking.k8s.io", "v1", "default",
                                           "inferencepools", pool)

    def make_pod(name, ip, ready):
        p = pod(name, ip, ready)
        p["metadata"].pop("uid")
        p["metadata"]["namespace"] = "default"
        status = p.pop("status")
        core.create_namespaced_pod("default", p)
        # no kubelet here: the status is written as a kubelet would (status subresource)
        cur = core.read_namespaced_pod(name, "default")
        body = api_client.sanitize_for_serialization(cur)
        body["status"] = status
        core.replace_namespaced_pod_status(name, "default", body)

    src = PoolSource(KubePoolAPI(api_client), "default", "llama", pool_every_s=2)
    seen: queue.Queue = queue.Queue()
    threading.Thread(target=src.watch, args=(lambda u, n: seen.put((u, n)),), daemon=True).start()
    try:
        assert seen.get(timeout=20) == ([], {})
        make_pod("vllm-0", "10.1.0.1", True)
        make_pod("vllm-1", "10.1.0.2", False)
        urls, names = seen.get(timeout=20)
        assert urls == ["http://10.1.0.1:8000"] and names == {"http://10.1.0.1:8000": "vllm-0"}
        p = pool["spec"]
        p["targetPorts"] = [{"number": 8000}, {"number": 8001}]
        cur = custom.get_namespaced_custom_object("inference.networking.k8s.io", "v1", "default",
                                                  "inferencepools", "llama")
        cur["spec"] = p
        custom.replace_namespaced_custom_object("inference.networking.k8s.io", "v1", "default",
                                                "inferencepools", "llama", cur)
        assert seen.get(timeout=20)[0] == ["http://10.1.0.1:8000", "http://10.1.0.1:8001"]
        core.delete_namespaced_pod("vllm-0", "default", grace_period_seconds=0)
        assert seen.get(timeout=20)[0] == []
    finally:
        src.stop()


def test_leader_election_against_the_api_server(kube):
    from anchorage.router.lease import KubeLeaseAPI
    api_client, client = _client(kube)
    api = KubeLeaseAPI(api_client)
    a = LeaseElector(api, "default", "llama-epp", "epp-a", duration_s=4, renew_s=1)
    b = LeaseElector(api, "default", "llama-epp", "epp-b", duration_s=4, renew_s=1)
    assert a.step() is True
    assert b.step() is False
    lease = json.loads(client.CoordinationV1Api(api_client).read_namespaced_lease(
        "llama-epp", "default", _preload_content=False).data)
    assert lease["spec"]["holderIdentity"] == "epp-a"
    # a stale write loses: b writes with the resourceVersion it read before a renewed
    stale = api.get("default", "llama-epp")
    assert a.step() is True
    with pytest.raises(Exception, match="Conflict|409"):
        api.replace("default", "llama-epp", stale["metadata"]["resourceVersion"],
                    {**stale["spec"], "holderIdentity": "epp-b"})
    time.sleep(4.2)                    # a stops renewing
    assert b.step() is True and a.step() is False


def test_the_charts_picker_rbac_is_enough_and_no_more_on_the_api_server(kube, tmp_path):
    """The chart's rendered ServiceAccount, Role, RoleBinding and InferencePool applied to
    the API server (the pool validated there by the Inference Extension's CRD); the
    picker's discovery and election then run with that ServiceAccount's own token."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from anchorage.router.lease import KubeLeaseAPI
    from anchorage.router.pool import KubePoolAPI
    from tests.chart.conftest import objects, render

    admin, _ = _client(kube)
    ext = client.ApiextensionsV1Api(admin)
    try:
        ext.create_custom_resource_definition(crd_for_the_test_server())
    except ApiException as exc:
        if exc.status != 409:
            raise
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    custom = client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": "llm"}})
    docs = objects(render({"epp": {"enabled": True, "replicaCount": 2,
                                   "route": {"parentRefs": [{"name": "gw"}]}}}))
    mine = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    sa = mine[("ServiceAccount", "anc-anchorage-epp")]
    core.create_namespaced_service_account("llm", sa)
    rbac.create_namespaced_role("llm", mine[("Role", "anc-anchorage-epp")])
    rbac.create_namespaced_role_binding("llm", mine[("RoleBinding", "anc-anchorage-epp")])
    pool = mine[("InferencePool", "anc-anchorage-qwen-7b")]
    for _ in range(100):
        try:
            custom.create_namespaced_custom_object("inference.networking.k8s.io", "v1", "llm",
                                                   "inferencepools", pool)
            break
        except ApiException as exc:
            if exc.status != 404:          # the CRD is not established yet
                raise
            time.sleep(0.1)
    # a model pod as the chart labels it, Ready
    dep = mine[("Deployment", "anc-anchorage-qwen-7b")]
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "llama-0", "labels": dep["spec"]["template"]["metadata"]["labels"]},
         "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}
    core.create_namespaced_pod("llm", p)
    cur = admin.sanitize_for_serialization(core.read_namespaced_pod("llama-0", "llm"))
    cur["status"] = pod("llama-0", "10.2.0.7")["status"]
    core.replace_namespaced_pod_status("llama-0", "llm", cur)

    kc = kube.service_account_kubeconfig(admin, "llm", "anc-anchorage-epp", tmp_path / "sa.kubeconfig")
    as_epp = config.new_client_from_config(str(kc))
    src = PoolSource(KubePoolAPI(as_epp), "llm", "anc-anchorage-qwen-7b", pool_every_s=2)
    seen: queue.Queue = queue.Queue()
    threading.Thread(target=src.watch, args=(lambda u, n: seen.put(u),), daemon=True).start()
    try:
        assert seen.get(timeout=20) == ["http://10.2.0.7:8000"]
    finally:
        src.stop()
    el = LeaseElector(KubeLeaseAPI(as_epp), "llm", "anc-anchorage-qwen-7b-epp", "epp-0",
                      duration_s=4, renew_s=1)
    assert el.step() is True and el.step() is True          # create, then update
    # and no more: another pool, another Lease, Secrets are refused
    with pytest.raises(ApiException) as e1:
        KubePoolAPI(as_epp).get_pool("llm", "someone-elses-pool")
    other = LeaseElector(KubeLeaseAPI(as_epp), "llm", "someone-elses-lease", "epp-0")
    assert other.step() is False                             # it cannot read that Lease
    with pytest.raises(ApiException) as e2:
        KubeLeaseAPI(as_epp).get("llm", "someone-elses-lease")
    with pytest.raises(ApiException) as e3:
        client.CoreV1Api(as_epp).list_namespaced_secret("llm")
    assert e1.value.status == e2.value.status == e3.value.status == 403


def test_two_pickers_only_the_leader_is_ready_and_the_other_takes_over_when_it_stops():
    import asyncio

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from anchorage.router.config import RouterConfig
    from anchorage.router.epp import EppConfig, EppServer
    from tests.router.fake_upstream import FakeUpstream
    from tests.support.procs import free_port

    SERVING = health_pb2.HealthCheckResponse.SERVING

    async def go():
        up = FakeUpstream("a")
        port = await up.start()
        pool = copy.deepcopy(POOL)
        pool["spec"]["targetPorts"] = [{"number": port}]
        pools = FakePoolAPI(pool, [pod("vllm-0", "127.0.0.1")])
        leases = FakeLeaseAPI()
        servers = {}
        for me in ("a", "b"):
            cfg = RouterConfig(discovery="inferencepool", health_interval_s=0.2).validate()
            e = EppConfig(port=free_port(), pool_name="llama", pool_namespace="llm",
                          # a long lease: a take-over before it expires is the release
                          leader_election=True, lease_duration_s=60.0, lease_renew_s=0.1,
                          identity=me).validate()
            servers[me] = await EppServer(cfg, e, pool_api=pools, lease_api=leases).start()

        async def status(me, svc="readiness"):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{servers[me].ports['grpc']}") as ch:
                r = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=svc))
                return r.status == SERVING

        async def ready_set():
            return {me for me in servers if await status(me)}
        try:
            for _ in range(100):
                if len(await ready_set()) == 1:
                    break
                await asyncio.sleep(0.05)
            (leader,) = await ready_set()
            other = "b" if leader == "a" else "a"
            assert leases.obj["spec"]["holderIdentity"] == leader
            assert await status(other, "liveness")           # alive, not ready
            # both discovered the pool's pod: the follower is warm
            assert all(s.picker.state.upstreams for s in servers.values())
            await servers.pop(leader).stop(0)
            t0 = asyncio.get_running_loop().time()
            while other not in await ready_set():
                assert asyncio.get_running_loop().time() - t0 < 30, "no take-over"
                await asyncio.sleep(0.05)
            assert leases.obj["spec"]["holderIdentity"] == other
        finally:
            for s in servers.values():
                await s.stop(0)
            await up.stop()
    asyncio.run(go())


def test_the_leader_shares_its_decisions_so_a_follower_takes_over_warm():
    import asyncio
    import json as _json

    import aiohttp
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg

    from anchorage.router.config import RouterConfig
    from anchorage.router.epp import EppConfig, EppServer
    from tests.router.epp_client import forward
    from tests.router.fake_upstream import FakeUpstream
    from tests.support.procs import free_port

    def body(s, turn):
        prompt = [s + 1] * 16 + list(range(100, 100 + 64 * (turn + 1)))
        return _json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1,
                            "session_id": f"s{s}"}).encode()

    async def go():
        ups = [FakeUpstream(c) for c in "abc"]
        ports = [await u.start() for u in ups]
        pods = [pod(f"vllm-{i}", "127.0.0.1") for i in range(1)]
        pool = copy.deepcopy(POOL)
        pool["spec"]["targetPorts"] = [{"number": p} for p in ports]
        pools, leases = FakePoolAPI(pool, pods), FakeLeaseAPI()
        mports = {"a": free_port(), "b": free_port()}
        servers = {}
        for me, other in (("a", "b"), ("b", "a")):
            cfg = RouterConfig(discovery="inferencepool", health_interval_s=0.2,
                               trusted_token="t" * 32, sync_interval_s=0.05).validate()
            e = EppConfig(port=free_port(), metrics_port=mports[me], pool_name="llama",
                          pool_namespace="llm", leader_election=True, lease_duration_s=60,
                          lease_renew_s=0.1, identity=me,
                          peers=[f"http://127.0.0.1:{mports[other]}"]).validate()
            servers[me] = await EppServer(cfg, e, pool_api=pools, lease_api=leases).start()
            if me == "a":                      # a leads
                for _ in range(100):
                    if servers["a"].readiness.ready:
                        break
                    await asyncio.sleep(0.05)
        assert servers["a"].readiness.ready and not servers["b"].readiness.leader
        for _ in range(100):                   # both know the replicas and their models
            if all(u.models for s in servers.values() for u in s.picker.state.upstreams.values()):
                break
            await asyncio.sleep(0.05)
        homes = {}
        async with aiohttp.ClientSession() as http:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{servers['a'].ports['grpc']}") as ch:
                stub = epg.ExternalProcessorStub(ch)
                for turn in range(2):
                    for s in range(6):
                        p = await forward(stub, http, "/v1/completions", body(s, turn))
                        homes.setdefault(s, set()).add(p.endpoint.split(",")[0])
            assert all(len(h) == 1 for h in homes.values()), homes
            assert len({next(iter(h)) for h in homes.values()}) > 1    # spread over replicas
            for _ in range(100):
                if servers["b"].share.applied >= 12:
                    break
                await asyncio.sleep(0.05)
            assert servers["b"].share.applied == 12 and servers["a"].share.sent >= 1
            await servers.pop("a").stop(0)             # the leader goes; b takes over
            for _ in range(200):
                if servers["b"].readiness.ready:
                    break
                await asyncio.sleep(0.05)
            assert servers["b"].readiness.ready
            async with grpc.aio.insecure_channel(f"127.0.0.1:{servers['b'].ports['grpc']}") as ch:
                stub = epg.ExternalProcessorStub(ch)
                # each session stays where it was (in another order than the leader saw
                # them: a cold picker would place them afresh, by load)
                for s in reversed(range(6)):
                    p = await forward(stub, http, "/v1/completions", body(s, 2))
                    assert {p.endpoint.split(",")[0]} == homes[s], (s, p.endpoint, homes[s])
            # an unauthorised batch is refused and changes nothing
            async with http.post(f"http://127.0.0.1:{mports['b']}/internal/v1/peer-decisions",
                                 data=b"[]", headers={"x-anchorage-internal": "wrong"}) as r:
                assert r.status == 403
        for s in servers.values():
            await s.stop(0)
        for u in ups:
            await u.stop()
    asyncio.run(go())
