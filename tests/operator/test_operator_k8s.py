"""The operator end to end: a real kube-apiserver + etcd + controller-manager (1.20) and a
real Prometheus scraping vLLM-shaped exporters. The operator runs as the chart deploys it:
the chart's rendered ServiceAccount, ClusterRole and binding are applied, and
``anchorage operator`` (the Deployment's arguments) authenticates with a real token of that
ServiceAccount, never as admin; the API server enforces owner-reference permissions. A
request the RBAC refuses fails the test (the operator's log is checked for 403s).

Waits poll the API with generous deadlines (no timing assertions): the operator's timer
runs every second here, with a 4 s metrics window and 0-3 s stabilization/cooldown.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml

from tests.operator.k8s_helpers import (G, P, V, OperatorProcess, apply_objects,
                                        chart_operator_objects, poll)
from tests.operator.k8s_helpers import deployment as _deployment

os.environ["ANCHORAGE_OPERATOR_INTERVAL_S"] = "1"

NS = "anchorage-test"
OPERATOR_NS = "anchorage-system"


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
def operator(kube, cluster, prometheus, tmp_path_factory):
    """The operator under the chart's own RBAC (its ServiceAccount's token)."""
    from kubernetes import client

    client.CoreV1Api(kube).create_namespace({"metadata": {"name": OPERATOR_NS}})
    objs = chart_operator_objects(OPERATOR_NS)
    applied = apply_objects(kube, objs)
    assert {o["kind"] for o in applied} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    (sa,) = [o["metadata"]["name"] for o in applied if o["kind"] == "ServiceAccount"]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = cluster.service_account_kubeconfig(kube, OPERATOR_NS, sa, work / "kubeconfig")
    # the tests' recorded access logs are files under pytest's base temporary directory
    op = OperatorProcess(dep, kubeconfig, work, access_log_dir=tmp_path_factory.getbasetemp())
    yield op
    alive = op.alive()
    op.stop()
    assert alive, op.output()[-3000:]
    assert not op.forbidden(), "\n".join(op.forbidden()[:10])


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
    # (the operator scales the Deployment, then writes its status: wait for both)
    poll(lambda: _replicas(kube, "web") == 4
         and _status(kube, "web").get("desiredReplicas") == 4, "scale-out to 4 replicas", 120)
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
    poll(lambda: _replicas(kube, "web") == 1
         and _status(kube, "web").get("desiredReplicas") == 1, "scale-in to 1 replica", 150)
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


def test_the_operator_identity_is_its_service_account(kube, operator):
    """The token really is the ServiceAccount's: it may not read Secrets, which an admin
    could."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    sa_api = config.new_client_from_config(str(operator.kubeconfig))
    with pytest.raises(ApiException) as e:
        client.CoreV1Api(sa_api).list_namespaced_secret(NS)
    assert e.value.status == 403
    assert f"system:serviceaccount:{OPERATOR_NS}:" in e.value.body
    client.CoreV1Api(kube).list_namespaced_secret(NS)   # the admin may


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


def _doc(api, name):
    from kubernetes import client

    from anchorage.config import parse

    cm = client.CoreV1Api(api).read_namespaced_config_map(f"{name}-anchorage", NS)
    return parse(cm.data["anchorage.yaml"]), cm


def _events(api, name) -> list[str]:
    from kubernetes import client

    return [ev.reason for ev in client.CoreV1Api(api).list_namespaced_event(
        NS, field_selector=f"involvedObject.name={name}").items]


def test_a_tuning_round_and_two_spec_edits_patch_the_configmap(kube, operator, prometheus,
                                                               tmp_path):
    """Under its own RBAC the operator writes the document, tunes it (the digital twin on a
    recorded access log), and patches it after each of two spec edits."""
    from kubernetes import client

    from tests.operator.access_log import write_access_log

    log = write_access_log(tmp_path / "access.jsonl")
    client.AppsV1Api(kube).create_namespaced_deployment(NS, deployment("tuned", 2))
    co = client.CustomObjectsApi(kube)
    in_spec = {"survivalThreshold": 0.3, "horizon": 120, "recencyScale": 30, "rMin": 0.6}
    body = acp("tuned", "tuned", prometheus.url, replicas=2,
               policy={"name": "hybrid", "parameters": in_spec},
               autoscaling={"enabled": False},
               tuning={"enabled": True, "intervalSeconds": 3600, "accessLogs": [str(log)],
                       "capacityBlocks": 180, "minImprovement": 0.01,
                       "parameters": [{"name": "survivalThreshold", "min": 0.05, "max": 0.8,
                                       "steps": 6}]})
    co.create_namespaced_custom_object(G, V, NS, P, body)

    # the first pass tunes (no run yet) and writes the tuner's parameters
    doc, cm = poll(lambda: _doc(kube, "tuned"), "the ConfigMap", 90)
    assert doc.generation == 1 and doc.policy.parameters_source == "tuner", doc
    assert doc.policy.parameters.survival_threshold < 0.3
    assert cm.metadata.owner_references[0].block_owner_deletion is True
    poll(lambda: "Tuned" in _events(kube, "tuned"), "a Tuned event", 60)
    # (events are posted while the handler runs, its status is written when it returns)
    poll(lambda: "adopted" in _status(kube, "tuned").get("lastTuningReason", ""),
         "the tuning reason in the status", 60)

    # spec edit 1: the spec's parameters take over again (a new metadata.generation)
    co.patch_namespaced_custom_object(G, V, NS, P, "tuned", {"spec": {"policy": {
        "parameters": {"rMin": 0.5}}}})
    doc, _ = poll(lambda: (d := _doc(kube, "tuned"))[0].generation == 2 and d, "generation 2", 60)
    assert doc.policy.parameters_source == "spec"
    assert doc.policy.parameters.r_min == 0.5 and doc.policy.parameters.survival_threshold == 0.3

    # spec edit 2: composite routing with scorer weights
    co.patch_namespaced_custom_object(G, V, NS, P, "tuned", {"spec": {"routing": {
        "policy": "composite", "weights": {"prefix": 2, "queue": 1}}}})
    try:
        doc, _ = poll(lambda: (d := _doc(kube, "tuned"))[0].generation == 3 and d,
                      "generation 3", 120)
    except AssertionError as e:
        raise AssertionError(f"{e}\nstatus: {_status(kube, 'tuned')}\noperator log:\n"
                             + operator.output()[-4000:]) from None
    assert doc.routing.router_kwargs() == {"scorers": {"prefix": 2.0, "queue": 1.0}}
    st = poll(lambda: (s := _status(kube, "tuned")).get("configGeneration") == 3 and s,
              "status.configGeneration 3", 60)
    assert st["observedGeneration"] == 3 and _cond(st, "Ready")["status"] == "True"
    assert _events(kube, "tuned").count("ConfigWritten") >= 3
    assert not operator.forbidden(), operator.forbidden()[:5]
    co.delete_namespaced_custom_object(G, V, NS, P, "tuned")
    poll(lambda: not [a for a in co.list_namespaced_custom_object(G, V, NS, P)["items"]
                      if a["metadata"]["name"] == "tuned"], "the policy deleted", 60)
