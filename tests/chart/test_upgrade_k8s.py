"""`helm install` then `helm upgrade` to a chart whose CRD schema changed, on a real
kube-apiserver 1.20 + etcd + kube-controller-manager on loopback (tests/support/k8s.py):
the pre-upgrade hook Job (run by tests/support/hooks.py under the hook's own RBAC, as its
pod would) applies the new schema, so a field the old CRD pruned is kept; an older chart
never downgrades it; the hook may touch nothing but the chart's CRDs. The same upgrade
(another chart version, same images) leaves every Deployment on its ReplicaSet (no pod
restarted), and the users' roles aggregate into view and edit (the clusterrole
aggregation controller)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import yaml

from tests.chart.conftest import CHART, NAMESPACE, RELEASE, model, with_images
from tests.conftest import need, need_module

GROUP, VERSION, PLURAL = "anchorage.dev", "v1alpha1", "agentcachepolicies"
ACP_CRD = "agentcachepolicies.anchorage.dev"
pytestmark = [pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    need_module("kubernetes")
    from tests.support import k8s

    gone = k8s.missing()
    need(not gone, f"Kubernetes 1.20 binaries ({', '.join(gone)})", k8s.BUILD_HINT)
    c = k8s.LocalCluster(tmp_path_factory.mktemp("k8s"), controllers=(
        "garbagecollector,deployment,replicaset,clusterrole-aggregation")).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def api(cluster):
    from kubernetes import client, config

    return client.ApiClient(config.new_client_from_config(str(cluster.kubeconfig)).configuration)


def chart_version(tmp, version: str, future_field: bool):
    """A copy of the chart at ``version``; with ``future_field`` its AgentCachePolicy CRD
    declares one more spec field (the schema change of an upgrade)."""
    dst = tmp / f"chart-{version}" / "anchorage"
    shutil.copytree(CHART, dst)
    meta = yaml.safe_load((dst / "Chart.yaml").read_text())
    meta["version"] = version
    (dst / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    if future_field:
        f = dst / "crds" / f"{ACP_CRD}.yaml"
        crd = yaml.safe_load(f.read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"]["futureField"] = {"type": "string", "description": "new in " + version}
        f.write_text(yaml.safe_dump(crd, sort_keys=False))
    return dst


VALUES = with_images({"models": [model("m")], "monitoring": {"prometheusURL": "http://127.0.0.1:9"}})


def _acp(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentCachePolicy",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"targetRef": {"name": "x"}, "futureField": "kept?"}}


def _replicasets(api) -> dict[str, set[str]]:
    from kubernetes import client

    out: dict[str, set[str]] = {}
    for rs in client.AppsV1Api(api).list_namespaced_replica_set(NAMESPACE).items:
        owner = (rs.metadata.owner_references or [None])[0]
        if owner is not None:
            out.setdefault(owner.name, set()).add(rs.metadata.name)
    return out


def _can(api, user: str, groups: list[str], verb: str, resource: str, group: str,
         namespace: str | None = NAMESPACE, name: str | None = None) -> bool:
    from kubernetes import client

    review = client.AuthorizationV1Api(api).create_subject_access_review({
        "spec": {"user": user, "groups": groups, "resourceAttributes": {
            "verb": verb, "resource": resource, "group": group, "namespace": namespace,
            "name": name}}})
    return review.status.allowed


def _poll(fn, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_upgrade_applies_the_new_crd_schema_and_restarts_no_pod(cluster, api, tmp_path):
    from helm_python import Config
    from kubernetes import client

    from tests.support.hooks import HookKubelet

    ext, co = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
    old, new = chart_version(tmp_path, "0.1.0", False), chart_version(tmp_path, "0.2.0", True)
    helm = Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE)
    with HookKubelet(cluster, api, NAMESPACE, tmp_path / "hooks") as hooks:
        helm.install(str(old), RELEASE, VALUES, namespace=NAMESPACE, create_namespace=True,
                     timeout=120)
        assert [r["rc"] for r in hooks.runs] == [0], hooks.runs
        crd = ext.read_custom_resource_definition(ACP_CRD)
        assert crd.metadata.annotations["anchorage.dev/chart-version"] == "0.1.0"
        # the old schema prunes the field the new chart adds (the control)
        co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _acp("before"))
        assert "futureField" not in co.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, "before")["spec"]
        deployments = _poll(lambda: (rs := _replicasets(api)) and len(rs) >= 3 and rs,
                            "the Deployments' ReplicaSets")

        helm.upgrade(str(new), RELEASE, VALUES, namespace=NAMESPACE, timeout=120)
        assert [r["rc"] for r in hooks.runs] == [0, 0], hooks.runs
        assert "0.2.0" in hooks.runs[1]["args"][-1]
        crd = ext.read_custom_resource_definition(ACP_CRD)
        assert crd.metadata.annotations["anchorage.dev/chart-version"] == "0.2.0"
        props = crd.spec.versions[0].schema.open_apiv3_schema.properties["spec"].properties
        assert "futureField" in props
        co.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, _acp("after"))
        assert co.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                               "after")["spec"]["futureField"] == "kept?"
        # the hook's objects are gone once it succeeded
        assert not [j for j in client.BatchV1Api(api).list_namespaced_job(NAMESPACE).items
                    if j.metadata.name.endswith("-crd-upgrade")]
    # a new chart version with the same images replaced no pod template: the Deployment
    # controller made no new ReplicaSet (a GPU engine would have reloaded its weights)
    time.sleep(2)
    assert _replicasets(api) == deployments

    # an older chart's hook never downgrades the schema
    r = subprocess.run([sys.executable, "-m", "anchorage", "crds", "apply", str(old / "crds"),
                        "--chart-version", "0.1.0", "--json"], capture_output=True, text=True,
                       env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    import json

    assert {c["action"] for c in json.loads(r.stdout)["crds"]} == {"skip"}
    assert "futureField" in ext.read_custom_resource_definition(ACP_CRD).spec.versions[0] \
        .schema.open_apiv3_schema.properties["spec"].properties


def test_the_hook_may_patch_only_the_charts_crds(cluster, api):
    """Least privilege of the CRD upgrade hook, asked of the API server (its rules are
    rendered fresh: Helm deleted the hook's objects after it succeeded)."""
    from kubernetes import client

    from tests.chart.conftest import objects, render

    docs = [d for d in objects(render(VALUES)) if d["metadata"]["name"].endswith("-crd-upgrade")
            and d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
    for d in docs:
        body = {k: v for k, v in d.items()}
        body["metadata"] = {k: v for k, v in d["metadata"].items() if k != "annotations"}
        if d["kind"] == "ServiceAccount":
            core.create_namespaced_service_account(NAMESPACE, body)
        elif d["kind"] == "ClusterRole":
            rbac.create_cluster_role(body)
        else:
            rbac.create_cluster_role_binding(body)
    (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    who = (f"system:serviceaccount:{NAMESPACE}:{sa}",
           ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", "system:authenticated"])
    crd_group = "apiextensions.k8s.io"
    for name in (ACP_CRD, "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        assert _can(api, *who, "patch", "customresourcedefinitions", crd_group, None, name)
    assert not _can(api, *who, "patch", "customresourcedefinitions", crd_group, None,
                    "rayservices.ray.io")
    assert not _can(api, *who, "create", "customresourcedefinitions", crd_group, None)
    assert not _can(api, *who, "delete", "customresourcedefinitions", crd_group, None, ACP_CRD)
    assert not _can(api, *who, "get", "secrets", "")


def test_namespace_viewers_and_editors_get_agentcachepolicies(cluster, api):
    """The chart's roles aggregate into the built-in view and edit (kube-controller-manager's
    clusterrole-aggregation controller), bound in one namespace as users are."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    for user, role in (("vera", "view"), ("ed", "edit")):
        rbac.create_namespaced_role_binding(NAMESPACE, {
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]})
    _poll(lambda: _can(api, "vera", [], "list", PLURAL, GROUP), "view to aggregate the viewer role")
    assert _can(api, "vera", [], "get", PLURAL, GROUP) and _can(api, "vera", [], "watch", PLURAL, GROUP)
    assert not _can(api, "vera", [], "create", PLURAL, GROUP)
    _poll(lambda: _can(api, "ed", [], "create", PLURAL, GROUP), "edit to aggregate the editor role")
    assert _can(api, "ed", [], "patch", PLURAL, GROUP) and _can(api, "ed", [], "delete", PLURAL, GROUP)
    # only in the namespace they are bound in
    assert not _can(api, "ed", [], "create", PLURAL, GROUP, namespace="other")
