"""The operator end to end: a real kube-apiserver + etcd + controller-manager (1.20) and a
real Prometheus scraping vLLM-shaped exporters; the operator runs under kopf's KopfRunner.

Waits poll the API with generous deadlines (no timing assertions): the operator's timer
runs every second here, with a 4 s metrics window and 0-3 s stabilization/cooldown.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml

from tests.operator.k8s_helpers import G, P, V, poll
from tests.operator.k8s_helpers import deployment as _deployment

os.environ["ANCHORAGE_OPERATOR_INTERVAL_S"] = "1"

NS = "anchorage-test"


@pytest.fixture(scope="module")
def kube(kube_api):
    from kubernetes import client

    client.CoreV1Api(kube_api).create_namespace({"metadata": {"name": NS}})
    co = client.CustomObjectsApi(kube_api)
    poll(lambda: co.create_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
         "metadata": {"name": "anchorage"}}), "peering object", 30)
    return kube_api


def acp(name: str, target: str, prom_url: str, **spec_over) -> dict:
    spec = {"targetRef": {"kind": "Deployment", "name": target},
            "policy": {"name": "hybrid", "parameters": {"horizon": 30, "rMin": 0.5}},
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4, "targetHitRate": 0.5,
                            "maxQueueDepth": 4, "maxKvUsage": 0.9,
                            "scaleUpStabilizationSeconds": 0, "scaleDownStabilizationSeconds": 3,
                            "cooldownSeconds": 2},
            "metrics": {"prometheusURL": prom_url, "windowSeconds": 4, "selector": 'job="vllm"'}}
    spec.update(spec_over)
    return {"apiVersion": f"{G}/{V}", "kind": "AgentCachePolicy",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def deployment(name: str, replicas: int) -> dict:
    return _deployment(name, NS, replicas)


def test_schema_rejects_invalid_and_applies_defaults(kube):
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    co = client.CustomObjectsApi(kube)
    bad = [
        ({"policy": {"name": "bogus"}}, "policy.name"),
        ({"autoscaling": {"targetHitRate": 1.5}}, "targetHitRate"),
        ({"autoscaling": {"minReplicas": 0}}, "minReplicas"),
        ({"routing": {"policy": "random"}}, "routing.policy"),
        ({"metrics": {"prometheusURL": "ftp://x"}}, "prometheusURL"),
        ({"policy": {"parameters": {"rMin": 2}}}, "rMin"),
        ({"tuning": {"parameters": [{"name": "bogus", "min": 0, "max": 1}]}}, "name"),
    ]
    for over, field in bad:
        body = acp("bad", "web", "http://127.0.0.1:9", **over)
        with pytest.raises(ApiException) as ei:
            co.create_namespaced_custom_object(G, V, NS, P, body)
        assert ei.value.status == 422 and field in ei.value.body, (over, ei.value.body)
    no_target = acp("bad", "web", "http://127.0.0.1:9")
    del no_target["spec"]["targetRef"]
    with pytest.raises(ApiException) as ei:
        co.create_namespaced_custom_object(G, V, NS, P, no_target)
    assert ei.value.status == 422 and "targetRef" in ei.value.body

    minimal = {"apiVersion": f"{G}/{V}", "kind": "AgentCachePolicy",
               "metadata": {"name": "minimal", "namespace": NS},
               "spec": {"targetRef": {"name": "nothing-here"}}}
    got = co.create_namespaced_custom_object(G, V, NS, P, minimal)["spec"]
    assert got["targetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nothing-here"}
    assert got["policy"]["name"] == "hybrid" and got["routing"]["policy"] == "agent"
    assert got["autoscaling"]["maxReplicas"] == 8 and got["autoscaling"]["enabled"] is True
    assert got["tuning"]["enabled"] is False and got["metrics"]["windowSeconds"] == 120
    # the scale subresource maps to spec.replicas
    co.patch_namespaced_custom_object_scale(G, V, NS, P, "minimal", {"spec": {"replicas": 3}})
    assert co.get_namespaced_custom_object(G, V, NS, P, "minimal")["spec"]["replicas"] == 3
    co.delete_namespaced_custom_object(G, V, NS, P, "minimal")


@pytest.fixture(scope="module")
def operator(kube, prometheus):
    from kopf.testing import KopfRunner

    with KopfRunner(["run", "-m", "anchorage.operator.handlers", "--all-namespaces",
                     "--peering", "anchorage", "--priority", "1000", "--verbose"],
                    timeout=60) as runner:
        yield runner
    assert runner.exception is None, runner.output[-3000:]


def _replicas(api, name):
    from kubernetes import client

    return client.AppsV1Api(api).read_namespaced_deployment(name, NS).spec.replicas


def _status(api, name):
    from kubernetes import client

    return client.CustomObjectsApi(api).get_namespaced_custom_object(G, V, NS, P, name).get("status", {})


def _cond(status, type_):
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def test_operator_scales_with_metrics_holds_on_outage_and_garbage_collects(
        kube, operator, prometheus, exporters):
    from kubernetes import client

    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    co = client.CustomObjectsApi(kube)
    apps.create_namespaced_deployment(NS, deployment("web", 1))
    for e in exporters:  # queueing: 2 x 20 waiting over 1 replica
        e.set(hit_rate=0.7, waiting=20, kv=0.5)
    co.create_namespaced_custom_object(G, V, NS, P, acp("web", "web", prometheus.url))

    # scale out on queue pressure, to maxReplicas
    poll(lambda: _replicas(kube, "web") == 4, "scale-out to 4 replicas", 120)
    st = _status(kube, "web")
    assert st["desiredReplicas"] == 4 and "queue" in st["lastScaleReason"]
    assert _cond(st, "MetricsAvailable")["status"] == "True"
    assert _cond(st, "Ready")["status"] == "True"
    assert st["parametersSource"] == "spec" and st["parameters"] == {"horizon": 30, "rMin": 0.5}

    # the ConfigMap the node agents mount, owned by the policy
    cm = core.read_namespaced_config_map("web-anchorage", NS)
    doc = yaml.safe_load(cm.data["anchorage.yaml"])
    assert doc["generation"] == 1 and doc["policy"]["parameters"] == {"horizon": 30, "rMin": 0.5}
    assert cm.metadata.owner_references[0].kind == "AgentCachePolicy"
    poll(lambda: any(ev.reason == "Scaled" for ev in core.list_namespaced_event(
        NS, field_selector="involvedObject.name=web").items), "a Scaled event", 60)

    # load goes away, hit rate healthy, no capacity misses: scale in step by step to 1
    for e in exporters:
        e.set(hit_rate=0.9, waiting=0, kv=0.1)
    poll(lambda: _replicas(kube, "web") == 1, "scale-in to 1 replica", 150)
    assert "scale in" in _status(kube, "web")["lastScaleReason"]

    # Prometheus outage: hold the replica count although the (unseen) load is high
    prometheus.stop()
    for e in exporters:
        e.set(hit_rate=0.7, waiting=50, kv=0.95)
    # (while Prometheus shuts down an answer may be an HTTP error; then it is unreachable)
    poll(lambda: "unreachable" in _cond(_status(kube, "web"), "MetricsAvailable").get("message", "")
         and _cond(_status(kube, "web"), "MetricsAvailable")["status"] == "False",
         "MetricsAvailable=False (Prometheus unreachable)", 60)
    # several timer passes (1 s each) later the decision is still held
    time.sleep(4)
    assert _replicas(kube, "web") == 1
    assert _cond(_status(kube, "web"), "MetricsAvailable")["status"] == "False"
    prometheus.start()
    poll(lambda: _cond(_status(kube, "web"), "MetricsAvailable").get("status") == "True",
         "metrics back", 60)
    for e in exporters:
        e.set(hit_rate=0.9, waiting=0, kv=0.1)

    # deleting the policy garbage-collects its ConfigMap (controller-manager)
    co.delete_namespaced_custom_object(G, V, NS, P, "web")

    def cm_gone():
        try:
            core.read_namespaced_config_map("web-anchorage", NS)
            return False
        except client.rest.ApiException as e:
            return e.status == 404

    poll(cm_gone, "ConfigMap garbage collection", 90)


def test_missing_target_and_invalid_spec_reported(kube, operator, prometheus):
    from kubernetes import client

    co = client.CustomObjectsApi(kube)
    co.create_namespaced_custom_object(G, V, NS, P, acp("ghost", "no-such-deployment",
                                                        prometheus.url))
    ready = poll(lambda: _cond(_status(kube, "ghost"), "Ready") or None, "Ready condition", 60)
    assert ready["status"] == "False" and ready["reason"] == "TargetNotFound"
    assert "no-such-deployment" in ready["message"]

    bad = acp("crossed", "web", prometheus.url)
    bad["spec"]["autoscaling"].update(minReplicas=5, maxReplicas=2)
    co.create_namespaced_custom_object(G, V, NS, P, bad)
    deg = poll(lambda: _cond(_status(kube, "crossed"), "Degraded") or None, "Degraded", 60)
    assert deg["status"] == "True" and "minReplicas (5) is greater than maxReplicas (2)" in deg["message"]
    for n in ("ghost", "crossed"):
        co.delete_namespaced_custom_object(G, V, NS, P, n)
