"""The chart as a GPU cluster runs it (rendered offline, helm-python-sdk): the router's
hosting (KubeRay's head ports and dashboard, the Deployment's probes and updates), the vLLM
pod (a uid without a passwd entry on a read-only root, model cache, escape hatches) and
monitoring that a stock kube-prometheus-stack picks up."""

from __future__ import annotations

import posixpath

import pytest

from tests.chart.conftest import (MONITORING_APIS, RELEASE, by_kind, k8s_validate, model,
                                  objects, one, render)


def _container(dep: dict, name: str) -> dict:
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# ---- router hosting -----------------------------------------------------------------------

def _kuberay_head_service_ports(rs: dict) -> dict[str, int]:
    """The head Service KubeRay builds (ray-operator/controllers/ray/common/service.go,
    getServicePorts): the Ray container's (index 0) declared ports; KubeRay's defaults only
    when none are declared; a metrics port added if missing."""
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in head.get("ports") or []}
    if not ports:
        ports = {"client": 10001, "gcs-server": 6379, "dashboard": 8265, "serve": 8000}
    ports.setdefault("metrics", 8080)
    return ports


def test_kuberay_can_reach_the_dashboard_to_deploy_the_serve_app():
    rs = one(objects(render({"router": {"kuberay": {"enabled": True}}})), "RayService")
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
    params = head["rayStartParams"]
    assert all(isinstance(v, str) for v in params.values())     # KubeRay: map[string]string
    # KubeRay's RayService controller deploys through the head Service's port named
    # "dashboard" (utils.FetchHeadServiceURL(..., DashboardPortName)) ...
    ports = _kuberay_head_service_ports(rs)
    assert ports["dashboard"] == 8265 and ports["serve"] == 8000 and ports["gcs-server"] == 6379
    # ... so the dashboard must listen on the pod's address, not loopback
    assert params.get("dashboard-host") == "0.0.0.0"
    assert head["template"]["spec"]["containers"][0]["name"] == "ray-head"
    assert all(p.get("protocol") == "TCP"
               for p in head["template"]["spec"]["containers"][0]["ports"])


def test_kuberay_network_policy_admits_the_operator_at_the_dashboard_only():
    docs = objects(render({"router": {"kuberay": {"enabled": True}}}))
    np = one(docs, "NetworkPolicy", "-router")
    by_port = {r["ports"][0]["port"]: r.get("from") for r in np["spec"]["ingress"] if "ports" in r}
    assert by_port["dashboard"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "kuberay-operator"}}}]
    assert by_port["serve"] is None                      # routerFrom empty: any client
    assert by_port["metrics"][0]["podSelector"] == {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}
    # the Ray pods reach each other on every port (GCS, raylets, object manager)
    (peers,) = [r["from"] for r in np["spec"]["ingress"] if "ports" not in r]
    assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"


def test_router_deployment_probes_ignore_backends_and_updates_roll():
    docs = objects(render({"router": {"replicaCount": 2}}))
    dep = one(docs, "Deployment", "-router")
    c = _container(dep, "router")
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    # Ready independent of the engines (issue 22): a router waiting for the first model
    # load stays in the Service and answers 503 error objects.
    assert c["readinessProbe"]["httpGet"]["path"] == "/livez"
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert dep["spec"]["replicas"] == 2
    with pytest.raises(Exception, match="replicaCount"):
        render({"router": {"replicaCount": 0}})


# ---- the vLLM pod -------------------------------------------------------------------------

PATH_ENV = ("HOME", "TMPDIR", "HF_HOME")


def _is_path_var(name: str) -> bool:
    return name in PATH_ENV or name.startswith("XDG_") or name.endswith(("_DIR", "_ROOT"))


def test_engine_runs_as_a_uid_without_passwd_on_a_read_only_root():
    dep = one(objects(render({})), "Deployment", "-qwen-7b")
    pod = dep["spec"]["template"]["spec"]
    engine = _container(dep, "vllm")
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["runAsNonRoot"]
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in engine["env"]}
    # getpass.getuser() (vLLM, torch inductor) reads these before the passwd database
    assert env["USER"] and env["LOGNAME"]
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    paths = {k: v for k, v in env.items() if _is_path_var(k)}
    assert {"HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_DIR", "HF_HOME", "TMPDIR"} <= set(paths)
    for var, path in paths.items():
        mount = next((m for mp, m in mounts.items()
                      if posixpath.commonpath([mp, path]) == mp), None)
        assert mount is not None, f"{var}={path} is on the read-only root"
        assert not mount.get("readOnly"), f"{var}={path} is on a read-only mount"
        vol = volumes[mount["name"]]
        assert "emptyDir" in vol or "persistentVolumeClaim" in vol, (var, vol)


def test_per_component_security_contexts_lay_over_the_global_ones():
    docs = objects(render({"operator": {"podSecurityContext": {"runAsUser": 2000}},
                           "modelDefaults": {"securityContext": {"readOnlyRootFilesystem": False}},
                           "nodeAgent": {"securityContext": {"runAsUser": 3000}}}))
    op = one(docs, "Deployment", "-operator")["spec"]["template"]["spec"]
    assert op["securityContext"]["runAsUser"] == 2000 and op["securityContext"]["fsGroup"] == 1000
    dep = one(docs, "Deployment", "-qwen-7b")
    assert _container(dep, "vllm")["securityContext"]["readOnlyRootFilesystem"] is False
    agent = _container(dep, "node-agent")["securityContext"]
    assert agent["readOnlyRootFilesystem"] is True and agent["runAsUser"] == 3000
    assert agent["capabilities"] == {"drop": ["ALL"]}
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000


def test_model_cache_claim_new_or_existing():
    docs = objects(render({"modelDefaults": {"modelCache": {"persistentVolumeClaim": {
        "create": True, "size": "500Gi", "storageClassName": "fast",
        "accessModes": ["ReadWriteMany"]}}}}))
    pvc = one(docs, "PersistentVolumeClaim", "-qwen-7b-models")
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                           "resources": {"requests": {"storage": "500Gi"}}}
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    vols = {v["name"]: v for v in one(docs, "Deployment", "-qwen-7b")["spec"]["template"]["spec"]["volumes"]}
    assert vols["model-cache"] == {"name": "model-cache", "persistentVolumeClaim": {
        "claimName": pvc["metadata"]["name"]}}
    existing = objects(render({"models": [model("a", modelCache={"existingClaim": "weights"})]}))
    assert not by_kind(existing, "PersistentVolumeClaim")
    vols = {v["name"]: v for v in one(existing, "Deployment", "-a")["spec"]["template"]["spec"]["volumes"]}
    assert vols["model-cache"]["persistentVolumeClaim"]["claimName"] == "weights"
    assert "emptyDir" in {v["name"]: v for v in one(objects(render({})), "Deployment", "-qwen-7b")
                          ["spec"]["template"]["spec"]["volumes"]}["model-cache"]
    with pytest.raises(Exception, match="choose one"):
        render({"models": [model("a", modelCache={"existingClaim": "w",
                                                  "persistentVolumeClaim": {"create": True}})]})


def test_token_context_length_and_escape_hatches():
    values = {
        "modelServiceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "m@p"}},
        "operator": {"serviceAccount": {"annotations": {"a": "op"}}},
        "router": {"serviceAccount": {"annotations": {"a": "router"}}},
        "modelDefaults": {"runtimeClassName": "nvidia", "priorityClassName": "llm-high",
                          "strategy": {"type": "Recreate"},
                          "extraVolumes": [{"name": "certs", "secret": {"secretName": "ca"}}],
                          "extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/ssl/ca",
                                                 "readOnly": True}]},
        "models": [model("big", hfTokenSecret={"name": "hf", "key": "tok"}, maxModelLen=32768,
                         nodeSelector={"gpu": "h100"},
                         tolerations=[{"key": "h100", "operator": "Exists", "effect": "NoSchedule"}],
                         affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}),
                   model("small", maxModelLen=0)],
    }
    docs = objects(render(values))
    big = one(docs, "Deployment", "-big")
    pod = big["spec"]["template"]["spec"]
    engine = _container(big, "vllm")
    token = next(e for e in engine["env"] if e["name"] == "HF_TOKEN")
    assert token == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "tok"}}}
    assert "--max-model-len=32768" in engine["args"]
    assert not [a for a in _container(one(docs, "Deployment", "-small"), "vllm")["args"]
                if a.startswith("--max-model-len")]
    default = _container(one(objects(render({})), "Deployment", "-qwen-7b"), "vllm")
    assert "--max-model-len=8192" in default["args"]      # fits vLLM's KV check on 24 GB
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "llm-high"
    assert big["spec"]["strategy"] == {"type": "Recreate"}
    assert {"name": "certs", "secret": {"secretName": "ca"}} in pod["volumes"]
    assert {"name": "certs", "mountPath": "/etc/ssl/ca", "readOnly": True} in engine["volumeMounts"]
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["tolerations"][0]["key"] == "h100"
    assert pod["affinity"]["nodeAffinity"]
    small = one(docs, "Deployment", "-small")["spec"]["template"]["spec"]
    assert small.get("nodeSelector") in (None, {}) and small["tolerations"][0]["key"] == "nvidia.com/gpu"
    sas = {s["metadata"]["name"]: s["metadata"].get("annotations") for s in by_kind(docs, "ServiceAccount")}
    assert sas[f"{RELEASE}-anchorage-model"] == {"iam.gke.io/gcp-service-account": "m@p"}
    assert sas[f"{RELEASE}-anchorage-operator"] == {"a": "op"}
    assert sas[f"{RELEASE}-anchorage-router"] == {"a": "router"}
    assert one(objects(render({})), "Deployment", "-qwen-7b")["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert k8s_validate(docs) >= 8


# ---- monitoring ---------------------------------------------------------------------------

def test_monitors_carry_the_release_label_kube_prometheus_stack_selects():
    docs = objects(render({}, api_versions=MONITORING_APIS))
    monitors = (by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor")
                + by_kind(docs, "PrometheusRule"))
    assert len(monitors) == 4
    assert {m["metadata"]["labels"]["release"] for m in monitors} == {"kube-prometheus-stack"}
    docs = objects(render({"monitoring": {"prometheusRelease": "prom", "labels": {"team": "x"}}},
                          api_versions=MONITORING_APIS))
    for m in by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor"):
        assert m["metadata"]["labels"]["release"] == "prom" and m["metadata"]["labels"]["team"] == "x"
    docs = objects(render({"monitoring": {"prometheusRelease": ""}}, api_versions=MONITORING_APIS))
    assert not [m for m in by_kind(docs, "PodMonitor") if "release" in m["metadata"]["labels"]]


def test_network_policies_admit_the_configured_prometheus_pods():
    # (Helm merges maps with the defaults: null removes a default key)
    docs = objects(render({"networkPolicy": {
        "monitoringNamespaceSelector": {"matchLabels": {"name": "obs",
                                                        "kubernetes.io/metadata.name": None}},
        "monitoringPodSelector": {"matchLabels": {"app": "prom",
                                                  "app.kubernetes.io/name": None}}}}))
    want = {"namespaceSelector": {"matchLabels": {"name": "obs"}},
            "podSelector": {"matchLabels": {"app": "prom"}}}
    models = one(docs, "NetworkPolicy", "-models")
    metrics = [r for r in models["spec"]["ingress"]
               if {"port": "agent", "protocol": "TCP"} in r["ports"] and
               {"port": "http", "protocol": "TCP"} in r["ports"]]
    assert metrics and metrics[0]["from"] == [want]
    assert one(docs, "NetworkPolicy", "-operator")["spec"]["ingress"][0]["from"] == [want]
    anyone = objects(render({"networkPolicy": {"monitoringPodSelector": None}}))
    assert one(anyone, "NetworkPolicy", "-operator")["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
