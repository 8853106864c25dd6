"""Install and uninstall the chart on a real kube-apiserver 1.20 (+ etcd) on loopback
(tests/support/k8s.py, binaries from scripts/k8s/build.sh): the CRDs, the operator's
Deployment and least-privilege RBAC, policy/v1beta1 PodDisruptionBudgets (1.20 serves no
policy/v1); an example AgentCachePolicy accepted, invalid ones rejected by the API server's
schema validation; the operator, run with the release's ServiceAccount token, configures a
node agent from an AgentCachePolicy edited twice; uninstall removes the release's objects.
No scheduler or kubelet: pods stay Pending, so the test asserts on objects, not on
readiness, and plays the kubelet's part of mounting the ConfigMap as a file."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.chart.conftest import CHART, NAMESPACE, RELEASE, model, with_images
from tests.conftest import REPO, need, need_module

GROUP, VERSION, PLURAL = "anchorage.dev", "v1alpha1", "agentcachepolicies"
pytestmark = [
    # The test API server's certificate is self-signed (loopback only).
    pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    need_module("kubernetes")
    from tests.support import k8s

    gone = k8s.missing()
    need(not gone, f"Kubernetes 1.20 binaries ({', '.join(gone)})", k8s.BUILD_HINT)
    c = k8s.LocalCluster(tmp_path_factory.mktemp("k8s"), controller_manager=False).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def api(cluster):
    from kubernetes import client, config

    return client.ApiClient(config.new_client_from_config(str(cluster.kubeconfig)).configuration)


@pytest.fixture(scope="module")
def hooks(cluster, api, tmp_path_factory):
    """Runs the chart's hook Jobs (the CRD upgrade) while Helm waits on them: no kubelet."""
    from tests.support.hooks import HookKubelet

    with HookKubelet(cluster, api, NAMESPACE, tmp_path_factory.mktemp("hooks")) as h:
        yield h


@pytest.fixture(scope="module")
def release(cluster, api, hooks):
    from helm_python import Config

    helm = Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE)
    # nothing listens on port 9: the release's policies' metrics stay on loopback
    # two router pods: the chart creates their internal token (kept across upgrades)
    values = {"models": [model("llama-8b"), model("qwen-7b", policy="cachewise")],
              "router": {"replicaCount": 2},
              "monitoring": {"prometheusURL": "http://127.0.0.1:9"}}
    rel = helm.install(str(CHART), RELEASE, with_images(values), namespace=NAMESPACE,
                       create_namespace=True, timeout=120)
    # the pre-install hook applied the chart's CRDs under its own RBAC
    assert [r["rc"] for r in hooks.runs] == [0], hooks.runs
    yield helm, rel
    helm.uninstall(RELEASE, ignore_not_found=True, timeout=120)


KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"   # earlier operators put it on


def _acp(name: str, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentCachePolicy",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"targetRef": {"name": "llama"}, **spec}}


def test_install_creates_operator_and_rbac(release, api):
    from kubernetes import client

    _, rel = release
    apps, rbac = client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    op = apps.read_namespaced_deployment(f"{RELEASE}-anchorage-operator", NAMESPACE)
    assert op.spec.template.spec.service_account_name == f"{RELEASE}-anchorage-operator"
    assert op.spec.template.spec.containers[0].args[0] == "operator"
    names = {d.metadata.name for d in apps.list_namespaced_deployment(NAMESPACE).items}
    assert names == {f"{RELEASE}-anchorage-{n}" for n in ("operator", "router", "llama-8b", "qwen-7b")}
    cr = rbac.read_cluster_role(f"{RELEASE}-anchorage-operator")
    assert any("agentcachepolicies" in r.resources for r in cr.rules)
    crb = rbac.read_cluster_role_binding(f"{RELEASE}-anchorage-operator")
    assert crb.subjects[0].name == f"{RELEASE}-anchorage-operator"
    rbac.read_namespaced_role(f"{RELEASE}-anchorage-router", NAMESPACE)
    # Kubernetes 1.20 serves no policy/v1: the chart fell back to policy/v1beta1.
    pdbs = [d for d in _manifest(rel) if d["kind"] == "PodDisruptionBudget"]
    assert pdbs and {d["apiVersion"] for d in pdbs} == {"policy/v1beta1"}
    # ... and no EndpointSlice v1: the router watches Endpoints.
    router = apps.read_namespaced_deployment(f"{RELEASE}-anchorage-router", NAMESPACE)
    assert "--k8s-kind=Endpoints" in router.spec.template.spec.containers[0].args


def _can(api, verb: str, resource: str, *, group: str = "", namespace: str = NAMESPACE,
         subresource: str = "") -> bool:
    """Ask the API server's RBAC authorizer about the operator's service account."""
    from kubernetes import client

    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{NAMESPACE}:{RELEASE}-anchorage-operator",
        groups=["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, resource=resource, group=group, namespace=namespace,
            subresource=subresource or None)))
    return client.AuthorizationV1Api(api).create_subject_access_review(review).status.allowed


def test_operator_rbac_is_least_privilege(release, api):
    allowed = [("patch", "deployments", "apps", "scale"), ("get", "statefulsets", "apps", "scale"),
               ("watch", "agentcachepolicies", GROUP, ""), ("patch", "agentcachepolicies", GROUP, "status"),
               ("create", "configmaps", "", ""), ("patch", "configmaps", "", ""),
               ("update", "agentcachepolicies", GROUP, "finalizers"),
               ("create", "events", "", "")]
    for verb, res, group, sub in allowed:
        assert _can(api, verb, res, group=group, subresource=sub, namespace="other"), (verb, res, sub)
    denied = [("get", "secrets", "", ""), ("delete", "configmaps", "", ""),
              ("update", "configmaps", "", ""), ("update", "agentcachepolicies", GROUP, ""),
              ("update", "deployments", "apps", ""), ("delete", "agentcachepolicies", GROUP, ""),
              ("create", "pods", "", ""), ("patch", "deployments", "apps", "")]
    for verb, res, group, sub in denied:
        assert not _can(api, verb, res, group=group, subresource=sub), (verb, res, sub)


def test_chart_policies_and_examples_accepted(release, api):
    from kubernetes import client

    co = client.CustomObjectsApi(api)
    acps = co.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]
    by_name = {a["metadata"]["name"]: a for a in acps}
    qwen = by_name[f"{RELEASE}-anchorage-qwen-7b"]
    assert qwen["spec"]["policy"]["name"] == "cachewise"
    assert qwen["spec"]["targetRef"]["name"] == f"{RELEASE}-anchorage-qwen-7b"
    assert qwen["spec"]["autoscaling"]["cooldownSeconds"] == 60   # the CRD's default applied
    for f in sorted((REPO / "manifests" / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            doc["metadata"]["namespace"] = NAMESPACE
            co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, doc)
            co.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                               doc["metadata"]["name"])


def _manifest(rel) -> list[dict]:
    text = rel["manifest"] if "manifest" in rel else rel["release"]["manifest"]
    return [d for d in yaml.safe_load_all(text) if d]


def test_policy_edits_reach_a_node_agent_through_the_operator_under_its_own_rbac(
        cluster, api, release, tmp_path):
    """Issue 16's "done when" for the operator and node agents: after `helm install`, the
    operator runs with the release's ServiceAccount token and arguments; an
    AgentCachePolicy is created and edited twice; the ConfigMap is written, then patched
    twice; a node agent reading it (the file the kubelet would mount) applies each
    change, seen in its warm-ups and its /metrics."""
    from kubernetes import client

    from anchorage.config import parse
    from tests.node_agent.harness import NodeAgent, wait, write_atomically
    from tests.operator.k8s_helpers import OperatorProcess, deployment, poll

    _, rel = release
    dep = next(d for d in _manifest(rel) if d["kind"] == "Deployment"
               and d["metadata"]["name"] == f"{RELEASE}-anchorage-operator")
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = cluster.service_account_kubeconfig(api, NAMESPACE, sa, tmp_path / "kubeconfig")
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    co = client.CustomObjectsApi(api)
    apps.create_namespaced_deployment(NAMESPACE, deployment("agents", NAMESPACE, 1))
    op = OperatorProcess(dep, kubeconfig, tmp_path)
    cfg = tmp_path / "anchorage.yaml"
    (tmp_path / "node").mkdir()
    na = None

    def mounted(generation: int):
        """The kubelet's part: the ConfigMap's document, once at ``generation``, as a file."""
        def read():
            cm = core.read_namespaced_config_map("agents-anchorage", NAMESPACE)
            doc = parse(cm.data["anchorage.yaml"])
            return doc.generation == generation and (doc, cm)
        doc, cm = poll(read, f"ConfigMap generation {generation}", 90)
        write_atomically(cfg, cm.data["anchorage.yaml"])
        return doc, cm

    try:
        co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _acp(
            "agents", targetRef={"name": "agents"}, replicas=1,
            autoscaling={"enabled": False},
            policy={"name": "hybrid", "parameters": {"rMin": 0.1, "prefetch": {"enabled": False}}},
            metrics={"prometheusURL": "http://127.0.0.1:9"}))
        doc, cm = mounted(1)
        assert cm.metadata.owner_references[0].name == "agents"
        na = NodeAgent(tmp_path / "node", cfg).start()
        wait(lambda: na.metric("anchorage_config_generation") == 1, "node agent at generation 1")
        wait(lambda: na.sidecar.warmups["skipped"] >= len(na.agents), "warm-ups skipped")
        assert na.warmups_sent == 0

        # edit 1: prefetch on, 5 per second
        co.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "agents", {
            "spec": {"policy": {"parameters": {"prefetch": {"enabled": True, "ratePerSecond": 5}}}}})
        doc, cm = mounted(2)
        assert doc.policy.parameters.prefetch_rate_per_s == 5.0
        wait(lambda: na.metric("anchorage_config_generation") == 2, "node agent at generation 2")
        wait(lambda: na.warmups_sent >= 3, "warm-ups sent")
        assert na.metric("anchorage_warmups_total", outcome="issued") >= 3

        # edit 2: a gate above the workload's predictability: warm-ups stop
        co.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "agents", {
            "spec": {"policy": {"parameters": {"rMin": 0.95}}}})
        doc, cm = mounted(3)
        assert cm.metadata.annotations["anchorage.dev/config-generation"] == "3"
        wait(lambda: na.metric("anchorage_config_generation") == 3, "node agent at generation 3")
        settled, issued = na.quiescent_counts()     # a warm-up issued before the switch lands
        assert issued == settled >= 3
        time.sleep(1.0)
        assert na.warmups_sent == settled
        st = co.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "agents")["status"]
        assert st["configGeneration"] == 3 and st["parameters"]["rMin"] == 0.95
        assert not op.forbidden(), op.forbidden()[:5]
        assert op.alive(), op.output()[-3000:]
        co.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "agents")
        poll(lambda: not [a for a in co.list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL)["items"] if a["metadata"]["name"] == "agents"],
            "the policy deleted", 60)

        # no finalizer on any policy, and one an earlier operator version left is taken
        # off: a policy deleted after the operator (helm uninstall) goes at once
        def finalized():
            return [a["metadata"]["name"] for a in co.list_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL)["items"] if a["metadata"].get("finalizers")]
        legacy = _acp("legacy", targetRef={"name": "agents"}, autoscaling={"enabled": False})
        legacy["metadata"]["finalizers"] = [KOPF_FINALIZER]
        co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, legacy)
        poll(lambda: not finalized(), "the operator taking the old finalizer off", 60)
        passes = op.metric_total("anchorage_operator_reconciles_total", acp="legacy")
        poll(lambda: op.metric_total("anchorage_operator_reconciles_total", acp="legacy")
             >= passes + 2, "two periodic passes on the policy", 60)
        assert not finalized(), finalized()
        op.stop()
        assert op.proc.returncode is not None
        for name in ("orphan", "legacy"):
            if name == "orphan":
                co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _acp(
                    "orphan", targetRef={"name": "agents"}, autoscaling={"enabled": False}))
            co.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            assert name not in [a["metadata"]["name"] for a in co.list_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL)["items"]], name
    finally:
        if na is not None:
            na.stop()
        op.stop()
        apps.delete_namespaced_deployment("agents", NAMESPACE)
        # if the test failed with the old finalizer still on: take it off, so that
        # `helm uninstall` below can delete the release's policies without an operator
        for a in co.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"]:
            co.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                              a["metadata"]["name"],
                                              {"metadata": {"finalizers": None}})


@pytest.mark.parametrize("spec,field", [
    ({"policy": {"name": "mru"}}, "spec.policy.name"),
    ({"autoscaling": {"targetHitRate": 1.5}}, "spec.autoscaling.targetHitRate"),
    ({"autoscaling": {"maxReplicas": 0}}, "spec.autoscaling.maxReplicas"),
    ({"metrics": {"prometheusURL": "prometheus:9090"}}, "spec.metrics.prometheusURL"),
])
def test_invalid_policy_rejected_by_api_server(release, api, spec, field):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    co = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as exc:
        co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _acp("bad", **spec))
    assert exc.value.status == 422
    assert field in json.loads(exc.value.body)["message"]


def test_upgrade_to_namespaced_operator(release, api):
    """helm upgrade: watching only `llm` moves the operator's rights into a Role there and
    the peering into a namespaced KopfPeering; the router picks up its new policy."""
    from kubernetes import client

    helm, _ = release
    core = client.CoreV1Api(api)

    def secrets():
        return {n: core.read_namespaced_secret(f"{RELEASE}-anchorage-{n}", NAMESPACE).data
                for n in ("tenant", "internal", "access-log")}

    before = secrets()
    values = {"models": [model("llama-8b"), model("qwen-7b", policy="cachewise")],
              "operator": {"watchNamespaces": [NAMESPACE]},
              "router": {"policy": "session", "replicaCount": 2}}
    helm.upgrade(str(CHART), RELEASE, with_images(values), namespace=NAMESPACE, timeout=120)
    # the random tokens the chart created survive the upgrade (lookup of the live Secret)
    assert secrets() == before and len(before["internal"]["token"]) == 64
    assert _can(api, "patch", "deployments", group="apps", subresource="scale")
    assert not _can(api, "patch", "deployments", group="apps", subresource="scale", namespace="other")
    assert not _can(api, "watch", "agentcachepolicies", group=GROUP, namespace="other")
    co = client.CustomObjectsApi(api)
    peer = co.get_namespaced_custom_object("kopf.dev", "v1", NAMESPACE, "kopfpeerings",
                                           f"{RELEASE}-anchorage")     # named per release
    assert peer["metadata"]["name"] == f"{RELEASE}-anchorage"
    apps = client.AppsV1Api(api)
    args = apps.read_namespaced_deployment(f"{RELEASE}-anchorage-router", NAMESPACE) \
        .spec.template.spec.containers[0].args
    assert "--policy=session" in args
    args = apps.read_namespaced_deployment(f"{RELEASE}-anchorage-operator", NAMESPACE) \
        .spec.template.spec.containers[0].args
    assert f"--namespace={NAMESPACE}" in args


def test_uninstall_removes_the_release(cluster, api, release):
    from kubernetes import client

    helm, _ = release
    helm.uninstall(RELEASE, timeout=120)
    apps, rbac = client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    assert apps.list_namespaced_deployment(NAMESPACE).items == []
    assert not [r for r in rbac.list_cluster_role().items
                if r.metadata.name.startswith(f"{RELEASE}-anchorage")]
    co = client.CustomObjectsApi(api)
    assert co.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)["items"] == []
    # Helm never deletes crds/: the CRD (and other releases' policies) survive.
    ext = client.ApiextensionsV1Api(api)
    assert ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}").spec.group == GROUP
