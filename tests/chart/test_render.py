"""charts/anchorage renders, lints and validates: default values and every optional feature
on, against current Kubernetes schemas (kubernetes-validate --strict); custom resources
against their CRD schemas; invalid values rejected by values.schema.json with a message that
names the field."""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from tests.chart.conftest import (
    CHART,
    CUSTOM_KINDS,
    crd_schema,
    k8s_validate,
    MONITORING_APIS,
    NAMESPACE,
    RELEASE,
    all_on_values,
    with_images,
    by_kind,
    crd_files,
    deep,
    deployment_router_values,
    model,
    objects,
    one,
    render,
)
from tests.conftest import REPO, need_module

def _validate_custom(d: dict) -> None:
    import jsonschema

    if d["kind"] in ("AgentCachePolicy", "ClusterKopfPeering", "KopfPeering"):
        jsonschema.validate(d, crd_schema(d["kind"]))
    assert d["metadata"]["name"]


def test_default_values_lint_clean():
    from helm_python import lint

    report = lint(str(CHART), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_all_on_values_lint_clean():
    from helm_python import lint

    report = lint(str(CHART), all_on_values(), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_default_render_objects(default_objects):
    kinds = sorted({d["kind"] for d in default_objects})
    assert kinds == sorted(["AgentCachePolicy", "ClusterKopfPeering", "ClusterRole",
                            "ClusterRoleBinding", "ConfigMap", "Deployment", "Job", "NetworkPolicy",
                            "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service",
                            "ServiceAccount"])
    # Without the monitoring API, `auto` renders no monitors or rules.
    assert not by_kind(default_objects, "ServiceMonitor")
    assert not by_kind(default_objects, "PrometheusRule")
    names = {d["metadata"]["name"] for d in by_kind(default_objects, "Deployment")}
    assert names == {f"{RELEASE}-anchorage-operator", f"{RELEASE}-anchorage-router",
                     f"{RELEASE}-anchorage-qwen-7b"}
    for d in default_objects:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]
    # the engines run what the headline benchmark's Anchorage runs: prefix-aware admission
    dep = one(default_objects, "Deployment", "-anchorage-qwen-7b")
    assert _env(_containers(dep)["vllm"])["ANCHORAGE_SCHEDULER"] == "prefix-aware"
    fcfs = one(objects(render({"modelDefaults": {"scheduler": ""}})), "Deployment",
               "-anchorage-qwen-7b")
    assert "ANCHORAGE_SCHEDULER" not in _env(_containers(fcfs)["vllm"])   # vLLM's FCFS
    # ... and vLLM's prefill chunk cap (longPrefillTokens; 0: none)
    assert "--long-prefill-token-threshold=2048" in _containers(dep)["vllm"]["args"]
    uncapped = one(objects(render({"modelDefaults": {"longPrefillTokens": 0}})), "Deployment",
                   "-anchorage-qwen-7b")
    assert not any(a.startswith("--long-prefill-token-threshold")
                   for a in _containers(uncapped)["vllm"]["args"])


@pytest.mark.parametrize("variant", ["defaults", "all-on", "all-on-deployment-router"])
def test_every_object_valid(variant):
    if variant == "defaults":
        docs = objects(render({}))
    elif variant == "all-on":
        docs = objects(render(all_on_values(), api_versions=MONITORING_APIS))
    else:
        docs = objects(render(deployment_router_values(), api_versions=MONITORING_APIS))
    checked = k8s_validate(docs)
    assert checked >= 10
    for d in docs:
        if d["kind"] in CUSTOM_KINDS:
            _validate_custom(d)


def test_all_on_renders_every_feature(all_on_objects):
    kinds = {d["kind"] for d in all_on_objects}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "RayService", "KopfPeering",
            "Role", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert "ClusterKopfPeering" not in kinds  # namespaced peering when namespaces are listed
    assert {d["metadata"]["namespace"] for d in by_kind(all_on_objects, "KopfPeering")} == {"llm", "agents"}
    # KubeRay replaces the Ray head Deployment and its Service.
    assert not [d for d in by_kind(all_on_objects, "Deployment") if d["metadata"]["name"].endswith("-router")]
    rs = one(all_on_objects, "RayService")
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    app = serve["applications"][0]
    assert app["import_path"] == "anchorage.router.app:app_builder"
    assert app["args"] == {"policy": "prefix", "policy_params": {"balance_abs_threshold": 8}, "block_size": 16,
                           "max_body_bytes": 1048576, "body_timeout_s": 5,
                           "max_inflight_per_replica": 64, "retries": 1,
                           "config_dir": "/etc/anchorage/models",
                           "discovery": "kubernetes", "k8s_namespace": NAMESPACE,
                           "k8s_selector": f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=model",
                           "k8s_port": 8000, "k8s_kind": "EndpointSlice"}
    assert [g["groupName"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]] == ["workers"]
    # KubeRay imports this builder with exactly these args: it must accept them.
    from anchorage.router.app import app_builder

    assert type(app_builder(app["args"])).__name__ == "Application"
    with pytest.raises(ValueError, match="unknown router setting"):
        app_builder({**app["args"], "bogus": 1})
    # Labels and the dashboards' namespace.
    assert all(d["metadata"]["labels"]["team"] == "llm" for d in all_on_objects
               if d["kind"] not in ("ClusterKopfPeering",))
    for cm in [d for d in by_kind(all_on_objects, "ConfigMap") if "dashboard" in d["metadata"]["name"]]:
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "LLM"
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        for d in by_kind(all_on_objects, kind):
            assert d["metadata"]["labels"]["release"] == "kps"


def test_monitoring_follows_capabilities():
    auto = objects(render({}, api_versions=MONITORING_APIS))
    assert {d["kind"] for d in auto} >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    off = objects(render({"monitoring": {"serviceMonitors": False, "prometheusRule": False}},
                         api_versions=MONITORING_APIS))
    assert not {d["kind"] for d in off} & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    forced = objects(render({"monitoring": {"serviceMonitors": True, "prometheusRule": True}}))
    assert {d["kind"] for d in forced} >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_pdb_api_follows_capabilities(default_objects):
    # Offline Helm serves policy/v1; the install test on Kubernetes 1.20 covers policy/v1beta1.
    pdbs = by_kind(default_objects, "PodDisruptionBudget")
    assert pdbs and {p["apiVersion"] for p in pdbs} == {"policy/v1"}
    text = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'policy/v1beta1' in text and '.Capabilities.APIVersions.Has "policy/v1"' in text


def test_prometheusrule_is_the_rules_file(all_on_objects):
    rule = one(all_on_objects, "PrometheusRule")
    expected = yaml.safe_load((CHART / "rules" / "anchorage.rules.yaml").read_text())
    assert rule["spec"] == expected
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"AnchorageHitRateDrop", "AnchoragePolicyErrors", "AnchorageWarmupsWasted",
            "AnchorageOperatorNotReconciling"} <= alerts


def test_dashboard_configmaps(default_objects):
    cms = {d["metadata"]["name"]: d for d in by_kind(default_objects, "ConfigMap")}
    for name in ("fleet", "policy", "router"):
        cm = cms[f"{RELEASE}-anchorage-dashboard-{name}"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key, text), = cm["data"].items()
        assert key == f"anchorage-{name}.json"
        assert json.loads(text) == json.loads((CHART / "dashboards" / f"{name}.json").read_text())


def test_chart_crds_are_the_manifests_crds():
    """charts/anchorage/crds/ holds byte copies of manifests/crd/ (one source of truth)."""
    src = {p.name: p for p in (REPO / "manifests" / "crd").glob("*.yaml")}
    assert "agentcachepolicies.anchorage.dev.yaml" in src, "manifests/crd/ has no AgentCachePolicy CRD"
    assert {p.name for p in crd_files()} == set(src), "charts/anchorage/crds/ and manifests/crd/ differ"
    for f in crd_files():
        assert f.read_bytes() == src[f.name].read_bytes(), (
            f"charts/anchorage/crds/{f.name} differs from manifests/crd/: run "
            f"`cp manifests/crd/*.yaml charts/anchorage/crds/`")


def test_crds_are_valid_crds():
    need_module("kubernetes_validate")
    docs = [d for f in crd_files() for d in yaml.safe_load_all(f.read_text()) if d]
    assert {d["metadata"]["name"] for d in docs} == {
        "agentcachepolicies.anchorage.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert k8s_validate(docs) == 3


# ---- operator RBAC: least privilege ------------------------------------------------------

def _rules(obj: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in obj["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


OPERATOR_NAMESPACED = {
    *(("anchorage.dev", "agentcachepolicies", v) for v in ("get", "list", "watch", "patch")),
    ("anchorage.dev", "agentcachepolicies/status", "get"),
    ("anchorage.dev", "agentcachepolicies/status", "patch"),
    ("anchorage.dev", "agentcachepolicies/finalizers", "update"),   # ownerRef blockOwnerDeletion
    *(("", "configmaps", v) for v in ("get", "create", "patch")),
    ("", "events", "create"),
    ("", "services", "get"),      # the Services tuning.accessLogs names (the token's check)
    *(("apps", r, v) for r in ("deployments/scale", "statefulsets/scale") for v in ("get", "patch")),
}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")}


def test_operator_rbac_cluster_wide(default_objects):
    cr = one(default_objects, "ClusterRole", "-operator")
    assert _rules(cr) == (OPERATOR_NAMESPACED | CRD_READ
                          | {("", "namespaces", "list"), ("", "namespaces", "watch")}
                          | {("kopf.dev", "clusterkopfpeerings", v) for v in ("get", "list", "watch", "patch")})
    crb = one(default_objects, "ClusterRoleBinding", "-operator")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-anchorage-operator",
                                "namespace": NAMESPACE}]
    dep = one(default_objects, "Deployment", "-operator")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator" and f"--peering={RELEASE}-anchorage" in args   # per release
    assert not [a for a in args if a.startswith("--namespace")]  # all namespaces
    assert "--metrics-port=8080" in args


def test_operator_rbac_namespaced(all_on_objects):
    cr = one(all_on_objects, "ClusterRole", "-operator")
    assert _rules(cr) == CRD_READ  # nothing else cluster-wide
    roles = [r for r in by_kind(all_on_objects, "Role") if r["metadata"]["name"].endswith("-operator")]
    assert {r["metadata"]["namespace"] for r in roles} == {"llm", "agents"}
    for r in roles:
        assert _rules(r) == OPERATOR_NAMESPACED | {("kopf.dev", "kopfpeerings", v)
                                                   for v in ("get", "list", "watch", "patch")}
    args = one(all_on_objects, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=llm" in args and "--namespace=agents" in args and "--verbose" in args
    # The arguments parse with the real `anchorage operator` command line.
    from anchorage.cli import build_parser
    parsed = build_parser().parse_args(args)
    assert parsed.namespace == ["llm", "agents"] and parsed.peering == f"{RELEASE}-anchorage"
    assert parsed.liveness == "http://0.0.0.0:8081/healthz" and not parsed.standalone
    assert parsed.metrics_port == 8080 and parsed.peering_lifetime_s == 60
    env = {e["name"]: e for e in one(all_on_objects, "Deployment", "-operator")
           ["spec"]["template"]["spec"]["containers"][0]["env"]}
    # kopf's peering identity is the pod name
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_no_wildcards_and_no_secrets_access(all_on_objects, default_objects):
    for d in all_on_objects + default_objects:
        if d["kind"] in ("Role", "ClusterRole"):
            for g, r, v in _rules(d):
                assert "*" not in (g, r, v), d["metadata"]["name"]
                assert r != "secrets", d["metadata"]["name"]


def test_router_rbac_reads_endpoints_only(default_objects):
    role = one(default_objects, "Role", "-router")
    assert _rules(role) == {("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")} | \
        {("", "endpoints", v) for v in ("get", "list", "watch")}
    static = objects(render({"router": {"discovery": {"mode": "static",
                                                      "staticReplicas": ["http://10.0.0.1:8000"]}}}))
    assert not [r for r in by_kind(static, "Role") if r["metadata"]["name"].endswith("-router")]
    sa = one(static, "ServiceAccount", "-router")
    assert sa["automountServiceAccountToken"] is False
    args = one(static, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    from anchorage.cli import build_parser
    parsed = build_parser().parse_args(args)
    assert parsed.discovery == "static" and parsed.replicas == "http://10.0.0.1:8000"


# ---- the model pods -------------------------------------------------------------------------

KV_EVENTS = ('{"enable_kv_cache_events":true,"publisher":"zmq",'
             '"endpoint":"ipc:///run/anchorage/kv.ipc","topic":"kv"}')


def _containers(dep: dict) -> dict[str, dict]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def _env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_temporal_tiering_renders_the_offload_connector(all_on_objects):
    """tiering temporal: vLLM's OffloadingConnector with the host budget, and the same budget
    and link bandwidth for the node agent's temporal controller; spatial alone: neither."""
    dep = one(objects(render({"models": [model("m", tiering="spatial,temporal",
                                               hostOffload={"memoryGiB": 64, "linkGBs": 50})]})),
              "Deployment", "-m")
    vllm = _containers(dep)["vllm"]
    args = vllm["args"]
    i = args.index("--kv-transfer-config")
    assert json.loads(args[i + 1]) == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                                       "kv_connector_extra_config": {"cpu_bytes_to_use": 64 << 30}}
    env = _env(vllm)
    assert env["ANCHORAGE_TIERING"] == "spatial,temporal"
    assert env["ANCHORAGE_HOST_BYTES"] == str(64 << 30) and env["ANCHORAGE_HOST_LINK_GBS"] == "50"
    from anchorage.node_agent.temporal import TemporalParams

    p = TemporalParams.from_env(env)  # what the plugin will read
    assert (p.host.capacity_bytes, p.host.h2d_bytes_s) == (64 << 30, 50e9)
    qwen = _containers(one(all_on_objects, "Deployment", "-qwen-7b"))["vllm"]
    i = qwen["args"].index("--kv-transfer-config")
    assert json.loads(qwen["args"][i + 1])["kv_connector_extra_config"] == {"cpu_bytes_to_use": 32 << 30}
    assert _env(qwen)["ANCHORAGE_HOST_LINK_GBS"] == "25"
    spatial = _containers(one(all_on_objects, "Deployment", "-llama-70b"))["vllm"]
    assert "--kv-transfer-config" not in spatial["args"]
    assert "ANCHORAGE_HOST_BYTES" not in _env(spatial)


def test_temporal_tiering_needs_host_memory():
    from helm_python import Chart, HelmRenderError

    chart = Chart.load(str(CHART))
    with pytest.raises(HelmRenderError) as exc:
        chart.render(with_images({"models": [model("a", tiering="temporal")]}), name=RELEASE,
                     namespace=NAMESPACE)
    assert 'tiering "temporal": set hostOffload.memoryGiB' in str(exc.value)


def test_model_pod_wiring(all_on_objects):
    dep = one(all_on_objects, "Deployment", "-llama-70b")
    spec = dep["spec"]["template"]["spec"]
    c = _containers(dep)
    assert set(c) == {"vllm", "node-agent"}
    vllm, agent = c["vllm"], c["node-agent"]
    args = vllm["args"]
    assert args[0] == "org/llama-70b"
    assert "--tensor-parallel-size=2" in args and "--enable-prefix-caching" in args
    assert "--max-model-len=32768" in args and "--max-num-seqs=64" in args
    i = args.index("--kv-events-config")
    assert json.loads(args[i + 1]) == json.loads(KV_EVENTS) and args[i + 1] == KV_EVENTS
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert vllm["resources"]["requests"]["nvidia.com/gpu"] == "2"
    env = _env(vllm)
    assert env["ANCHORAGE_POLICY"] == "hybrid" and env["ANCHORAGE_SCHEDULER"] == "prefix-aware"
    assert env["ANCHORAGE_TIERING"] == "spatial"
    assert env["VLLM_PLUGINS"] == "anchorage"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    # ANCHORAGE_CONFIG points into the operator ConfigMap's mount, in both containers.
    mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
    cfg_dir = mounts["anchorage-config"]
    assert env["ANCHORAGE_CONFIG"].startswith(cfg_dir + "/")
    assert _env(agent)["ANCHORAGE_CONFIG"] == env["ANCHORAGE_CONFIG"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["anchorage-config"]["configMap"]["optional"] is True
    assert vols["model-cache"]["persistentVolumeClaim"]["claimName"] == "weights"
    # The KV events socket lives in an emptyDir both containers mount at /run/anchorage.
    assert "emptyDir" in vols["anchorage-run"]
    for cont in (vllm, agent):
        assert {"name": "anchorage-run", "mountPath": "/run/anchorage"} in cont["volumeMounts"]
    assert agent["args"][0] == "node-agent"
    assert "--kv-events=ipc:///run/anchorage/kv.ipc" in agent["args"]
    assert "--engine-url=http://127.0.0.1:8000" in agent["args"]
    assert "--no-warmup" in agent["args"]
    assert {p["name"] for p in agent["ports"]} == {"agent", "access-log"}
    # Fixed replicas when the policy does not autoscale; none (operator-owned) when it does.
    assert dep["spec"]["replicas"] == 2
    assert "replicas" not in one(all_on_objects, "Deployment", "-qwen-7b")["spec"]


def test_agentcachepolicy_targets_its_deployment(all_on_objects):
    acps = {a["metadata"]["name"]: a for a in by_kind(all_on_objects, "AgentCachePolicy")}
    qwen = acps[f"{RELEASE}-anchorage-qwen-7b"]["spec"]
    assert qwen["targetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                 "name": f"{RELEASE}-anchorage-qwen-7b"}
    assert qwen["policy"] == {"name": "cachewise"}
    assert qwen["metrics"]["selector"] == 'namespace="llm",model_name="qwen"'
    assert qwen["autoscaling"]["maxReplicas"] == 6 and qwen["tuning"]["enabled"] is True
    # The engines' block size (the operator's capacity-miss signal counts in it) unless set.
    assert qwen["tuning"]["blockSize"] == 16 and qwen["tuning"]["intervalSeconds"] == 600
    own = render({"models": [{"name": "m", "model": "x", "blockSize": 32}]})
    assert one(objects(own), "AgentCachePolicy")["spec"]["tuning"] == {"blockSize": 32}
    set_ = render({"models": [{"name": "m", "model": "x", "blockSize": 32, "agentCachePolicy":
                               {"spec": {"tuning": {"blockSize": 64}}}}]})
    assert one(objects(set_), "AgentCachePolicy")["spec"]["tuning"] == {"blockSize": 64}


def test_security_contexts(all_on_objects, default_objects):
    for docs in (default_objects, all_on_objects):
        pods = [deep(d, "spec", "template", "spec") for d in docs if d["kind"] == "Deployment"]
        rs = by_kind(docs, "RayService")
        if rs:
            rcc = rs[0]["spec"]["rayClusterConfig"]
            pods.append(rcc["headGroupSpec"]["template"]["spec"])
            pods += [g["template"]["spec"] for g in rcc["workerGroupSpecs"]]
        assert pods
        for pod in pods:
            assert pod["securityContext"]["runAsNonRoot"] is True
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"]["drop"] == ["ALL"]
                for e in c.get("env", []):
                    if any(s in e["name"] for s in ("TOKEN", "SECRET", "PASSWORD", "KEY")):
                        assert "value" not in e, f"{c['name']}: {e['name']} must come from a Secret"


def test_network_policies(default_objects):
    models = one(default_objects, "NetworkPolicy", "-models")
    ingress = models["spec"]["ingress"]
    api = [r for r in ingress if {"port": "http", "protocol": "TCP"} in r["ports"] and
           any("podSelector" in p for p in r["from"])][0]
    assert api["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert len(api["from"]) == 1
    operator = one(default_objects, "NetworkPolicy", "-operator")
    assert operator["spec"]["ingress"][0]["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert "namespaceSelector" in operator["spec"]["ingress"][0]["from"][0]
    assert not objects(render({"networkPolicy": {"enabled": False}})) or \
        not by_kind(objects(render({"networkPolicy": {"enabled": False}})), "NetworkPolicy")


def _container(docs: list[dict], deployment_suffix: str, name: str) -> dict:
    d = one(docs, "Deployment", deployment_suffix)
    return next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_tenant_secret_and_access_log_token(default_objects):
    """Issue 21 items 1 and 3: the chart creates a random tenant secret for the router
    (tenant ids and cache salts are keyed) and an access-log token that only the node
    agents and the operator read, by secretKeyRef, never as a literal; the access log is
    on its own port, which the NetworkPolicy opens to the operator alone."""
    secrets = {d["metadata"]["name"]: d for d in by_kind(default_objects, "Secret")}
    tenant, token = secrets[f"{RELEASE}-anchorage-tenant"], secrets[f"{RELEASE}-anchorage-access-log"]
    for s, key in ((tenant, "secret"), (token, "token")):
        assert len(base64.b64decode(s["data"][key])) == 48
        assert s["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    again = {d["metadata"]["name"]: d for d in by_kind(objects(render({})), "Secret")}
    assert again[tenant["metadata"]["name"]]["data"] != tenant["data"]   # random, not fixed
    ref = {"secretKeyRef": {"name": f"{RELEASE}-anchorage-tenant", "key": "secret"}}
    assert _env(_container(default_objects, "-router", "router"))["ANCHORAGE_TENANT_SECRET"] == ref
    ref = {"secretKeyRef": {"name": f"{RELEASE}-anchorage-access-log", "key": "token"}}
    agent = _container(default_objects, "-qwen-7b", "node-agent")
    for c in (agent, _container(default_objects, "-operator", "operator")):
        assert _env(c)["ANCHORAGE_ACCESS_LOG_TOKEN"] == ref
    assert "--access-log-port=9401" in agent["args"]
    assert {"name": "access-log", "containerPort": 9401, "protocol": "TCP"} in agent["ports"]
    svc = one(default_objects, "Service", "-qwen-7b")
    assert {"name": "access-log", "port": 9401, "targetPort": "access-log",
            "protocol": "TCP"} in svc["spec"]["ports"]
    ingress = one(default_objects, "NetworkPolicy", "-models")["spec"]["ingress"]
    to_log = [r for r in ingress if {"port": "access-log", "protocol": "TCP"} in r["ports"]]
    assert len(to_log) == 1 and len(to_log[0]["from"]) == 1
    assert to_log[0]["from"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"] == "operator"
    # existing Secrets: referenced, none created
    docs = objects(render({"secrets": {"tenant": {"existingSecret": "mine", "key": "k"},
                                       "accessLog": {"existingSecret": "ops", "key": "t"}}}))
    assert not by_kind(docs, "Secret")
    assert _env(_container(docs, "-router", "router"))["ANCHORAGE_TENANT_SECRET"] == {
        "secretKeyRef": {"name": "mine", "key": "k"}}
    assert _env(_container(docs, "-qwen-7b", "node-agent"))["ANCHORAGE_ACCESS_LOG_TOKEN"] == {
        "secretKeyRef": {"name": "ops", "key": "t"}}


def test_router_deployment(default_objects):
    dep = one(default_objects, "Deployment", "-router")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["router", "--host=0.0.0.0", "--port=8000", "--policy=agent",
                         "--policy-params={}", "--block-size=16", "--max-body-bytes=4194304",
                         "--body-timeout-s=5",
                         "--max-inflight-per-replica=64", "--retries=2", "--config-dir=/etc/anchorage/models",
                         "--discovery=kubernetes",
                         f"--k8s-namespace={NAMESPACE}",
                         f"--k8s-selector=app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=model",
                         "--k8s-port=8000", "--k8s-kind=EndpointSlice"]
    # Serve's proxy timeouts for a busy node: the same as a local router's Ray gets
    from anchorage.router.app import RAY_WORKER_PRIORITY, SERVE_PROXY_TIMEOUTS
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert {k: env.get(k) for k in SERVE_PROXY_TIMEOUTS} == SERVE_PROXY_TIMEOUTS
    # and Ray's workers (the router replica, HAProxy) at normal priority, as a local router's
    assert {k: env.get(k) for k in RAY_WORKER_PRIORITY} == RAY_WORKER_PRIORITY
    # The same arguments parse with the real `anchorage router` command line.
    from anchorage.cli import build_parser
    args = build_parser().parse_args(c["args"])
    assert args.policy == "agent" and args.k8s_kind == "EndpointSlice" and args.host == "0.0.0.0"
    svc = one(default_objects, "Service", "-router")
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    # The model Services carry the labels the router's discovery selects on.
    msvc = one(default_objects, "Service", "-qwen-7b")
    assert msvc["metadata"]["labels"]["app.kubernetes.io/component"] == "model"
    assert msvc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_notes_tell_how_to_reach_router_and_dashboards():
    notes = render({})["anchorage/templates/NOTES.txt"]
    assert f"port-forward svc/{RELEASE}-anchorage-router 8000:8000" in notes
    assert "grafana_dashboard=1" in notes and "Fleet, Policy and Router" in notes
    kuberay = render({"router": {"kuberay": {"enabled": True}}})["anchorage/templates/NOTES.txt"]
    assert f"{RELEASE}-anchorage-router-serve-svc" in kuberay


# ---- values.schema.json ------------------------------------------------------------------

BAD_VALUES = [
    ({"router": {"policy": "fastest"}}, "/router/policy"),
    ({"models": [model("Bad_Name")]}, "/models/0/name"),
    ({"models": [model("a", tensorParallelSize=0)]}, "/models/0/tensorParallelSize"),
    ({"models": [model("a", policy="mru")]}, "/models/0/policy"),
    ({"models": [model("a", vllmPlugins="other")]}, "/models/0/vllmPlugins"),
    ({"models": [model("a", blockSize=24)]}, "/models/0/blockSize"),
    ({"models": [model("a", longPrefillTokens=-1)]}, "/models/0/longPrefillTokens"),
    ({"models": [model("a", tiering="temporal,spatial")]}, "/models/0/tiering"),
    ({"models": [model("a", hostOffload={"linkGBs": 0})]}, "/models/0/hostOffload/linkGBs"),
    ({"models": [{"name": "a", "image": {"repository": "r", "tag": "t"}}]}, "model"),
    ({"models": [model("a", agentCachePolicy={"enabled": True, "spec": {"targetRef": {"name": "x"}}})]},
     "/models/0/agentCachePolicy/spec"),
    ({"operator": {"replicas": 2}}, "replicas"),
    ({"operator": {"logLevel": "verbose"}}, "/operator/logLevel"),
    ({"router": {"discovery": {"mode": "static"}}}, "/router/discovery/staticReplicas"),
    ({"router": {"port": 70000}}, "/router/port"),
    ({"monitoring": {"serviceMonitors": "yes"}}, "/monitoring/serviceMonitors"),
    ({"monitoring": {"prometheusURL": "prometheus:9090"}}, "/monitoring/prometheusURL"),
    ({"nodeAgent": {"accessLogSampleRate": 2}}, "/nodeAgent/accessLogSampleRate"),
    ({"routerr": {}}, "routerr"),
]


@pytest.mark.parametrize("values,where", BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_schema_rejects_invalid_values(values, where):
    need_module("helm_python", "helm-python-sdk")
    from helm_python import Chart, HelmValuesError

    chart = Chart.load(str(CHART))
    with pytest.raises(HelmValuesError) as exc:
        chart.render(with_images(values), name=RELEASE, namespace=NAMESPACE)
    msg = str(exc.value)
    assert "schema" in msg and where in msg, msg


def test_duplicate_model_names_rejected():
    from helm_python import Chart, HelmRenderError

    chart = Chart.load(str(CHART))
    with pytest.raises(HelmRenderError) as exc:
        chart.render(with_images({"models": [model("a"), model("a")]}), name=RELEASE, namespace=NAMESPACE)
    assert 'the name "a" is used twice' in str(exc.value)


def test_a_prefill_cap_above_the_model_length_is_a_clear_error():
    from helm_python import Chart, HelmRenderError

    chart = Chart.load(str(CHART))
    with pytest.raises(HelmRenderError) as exc:
        chart.render(with_images({"models": [model("a", maxModelLen=1024)]}), name=RELEASE,
                     namespace=NAMESPACE)                  # the default cap is 2048 tokens
    assert 'longPrefillTokens (2048) must not exceed maxModelLen (1024)' in str(exc.value)
    ok = objects(chart.render(with_images({"models": [model("a", maxModelLen=1024, longPrefillTokens=512)]}),
                              name=RELEASE, namespace=NAMESPACE))
    assert "--long-prefill-token-threshold=512" in _containers(
        one(ok, "Deployment", "-anchorage-a"))["vllm"]["args"]


def test_values_documented_field_by_field():
    """Every leaf of values.yaml has a comment line right above it or above its parent
    block (the schema's properties mirror values.yaml, so no field goes undocumented)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load("\n".join(lines))

    def keys(v, s, path=""):
        assert s.get("additionalProperties") is False or "properties" not in s or path == "", path
        for k, sub in v.items():
            p = f"{path}.{k}" if path else k
            props = s.get("properties", {})
            assert k in props, f"values.yaml key {p} is not in values.schema.json"
            if isinstance(sub, dict) and props[k].get("properties"):
                keys(sub, props[k], p)
    keys(values, schema)
    undocumented = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("- {") or ":" not in stripped:
            continue
        key = stripped.lstrip("- ").split(":")[0]
        if not key or " " in key:
            continue
        prev = lines[i - 1].strip() if i else ""
        indent = len(line) - len(line.lstrip())
        if prev.startswith("#") or prev.startswith("- #"):
            continue
        # A field inside a documented inline map (e.g. resources' requests/limits) is fine.
        parent = next((lines[j] for j in range(i - 1, -1, -1)
                       if lines[j].strip() and not lines[j].strip().startswith("#")
                       and len(lines[j]) - len(lines[j].lstrip()) < indent), "")
        if parent.strip().rstrip(":") in ("resources", "requests", "limits", "podSecurityContext",
                                          "containerSecurityContext", "seccompProfile", "capabilities",
                                          "monitoringNamespaceSelector", "matchLabels", "spec", "policy",
                                          "routing", "autoscaling", "tolerations"):
            continue
        undocumented.append(f"{i + 1}: {stripped}")
    assert not undocumented, "values.yaml fields without a comment:\n" + "\n".join(undocumented)


def test_rayservice_pod_templates_valid(all_on_objects):
    """KubeRay's pod templates are core PodTemplateSpecs: validate them as Pods."""
    rcc = one(all_on_objects, "RayService")["spec"]["rayClusterConfig"]
    templates = [rcc["headGroupSpec"]["template"]] + [g["template"] for g in rcc["workerGroupSpecs"]]
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"ray-{i}", **t["metadata"]},
             "spec": t["spec"]} for i, t in enumerate(templates)]
    assert k8s_validate(pods) == 2


def test_monitors_select_existing_ports(all_on_objects):
    """Every ServiceMonitor/PodMonitor endpoint names a port of the objects it selects."""
    def matches(sel: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in sel["matchLabels"].items())

    svcs = by_kind(all_on_objects, "Service")
    pods = [d["spec"]["template"] for d in by_kind(all_on_objects, "Deployment")]
    monitors = by_kind(all_on_objects, "ServiceMonitor") + by_kind(all_on_objects, "PodMonitor")
    assert len(monitors) == 2  # operator ServiceMonitor + models PodMonitor (KubeRay: no router one)
    for m in monitors:
        if m["kind"] == "ServiceMonitor":
            targets = [s for s in svcs if matches(m["spec"]["selector"], s["metadata"]["labels"])]
            ports = {p["name"] for t in targets for p in t["spec"]["ports"]}
            wanted = {e["port"] for e in m["spec"]["endpoints"]}
        else:
            targets = [p for p in pods if matches(m["spec"]["selector"], p["metadata"]["labels"])]
            ports = {cp["name"] for t in targets for c in t["spec"]["containers"] for cp in c["ports"]}
            wanted = {e["port"] for e in m["spec"]["podMetricsEndpoints"]}
        assert targets and wanted <= ports, (m["metadata"]["name"], wanted, ports)
    router = objects(render(deployment_router_values(), api_versions=MONITORING_APIS))
    sm = one(router, "ServiceMonitor", "-router")
    assert sm["spec"]["endpoints"][0]["port"] == "http"
    assert one(router, "Service", "-router")["spec"]["ports"][0]["name"] == "http"


def test_resource_quantities_are_strings(all_on_objects):
    """Server-side apply (Helm 4's default) on Kubernetes 1.20 rejects bare numbers in
    quantities ("expected string"); the chart renders every quantity as a string."""
    values = all_on_values()
    values["modelDefaults"] = {"resources": {"requests": {"cpu": 4, "memory": 1_000_000_000},
                                             "limits": {"cpu": 0.5}}}
    docs = objects(render(values, api_versions=MONITORING_APIS)) + all_on_objects
    seen = 0
    for d in docs:
        pod = deep(d, "spec", "template", "spec") or {}
        for c in pod.get("containers", []):
            for section in ("requests", "limits"):
                for k, q in (c.get("resources", {}).get(section) or {}).items():
                    assert isinstance(q, str), (d["metadata"]["name"], c["name"], k, q)
                    seen += 1
    assert seen > 10
    dep = one(objects(render(values)), "Deployment", "-llama-70b")
    res = _containers(dep)["vllm"]["resources"]
    assert res["requests"] == {"cpu": "4", "memory": "1000000000", "nvidia.com/gpu": "2"}
    assert res["limits"] == {"cpu": "0.5", "memory": "64Gi", "nvidia.com/gpu": "2"}


def test_long_names_stay_valid():
    """A 53-character release (Helm's maximum) and a 40-character model name: Service and
    label values stay DNS labels (<= 63), and the mounted ConfigMap is exactly the one the
    operator writes for the policy (`<policy name>-anchorage`, operator/config.py)."""
    import re as _re

    release = "r" * 53
    long_model = "m" * 40
    need_module("helm_python")
    from helm_python import Chart

    out = Chart.load(str(CHART)).render(with_images({"models": [model(long_model)]}), name=release,
                                         namespace=NAMESPACE)
    docs = objects(out)
    dns_label = _re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    for d in docs:
        name = d["metadata"]["name"]
        assert len(name) <= 253
        if d["kind"] in ("Service", "Namespace"):
            assert len(name) <= 63 and dns_label.match(name), name
        for v in (d["metadata"].get("labels") or {}).values():
            assert len(v) <= 63, (name, v)
    acp = one(docs, "AgentCachePolicy")
    dep = one(docs, "Deployment", "m" * 10)
    cm = [v["configMap"]["name"] for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert cm == [acp["metadata"]["name"] + "-anchorage"]
    assert acp["spec"]["targetRef"]["name"] == dep["metadata"]["name"]


def test_router_reads_a_models_policy_under_its_served_name(tmp_path):
    """Requests name a model by its served name (``servedModelName``, default ``name``): the
    router mounts each model's policy ConfigMap there, so a request for
    ``meta-llama/Llama-3.1-8B`` runs that model's routing policy. The mounts are laid out as
    the kubelet does a ConfigMap volume (``..data`` links to a timestamped directory)."""
    from anchorage.router.config import RouterConfig
    from anchorage.router.configdoc import ConfigWatch
    from anchorage.router.state import RoutingState

    values = deployment_router_values()
    values["models"] = [model("llama", servedModelName="meta-llama/Llama-3.1-8B"),
                        model("qwen")]
    docs = objects(render(values))
    router = one(docs, "Deployment", "-router")
    cont = router["spec"]["template"]["spec"]["containers"][0]
    vols = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    args = cont.get("args", []) + cont.get("command", [])
    config_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--config-dir="))
    policies = {"llama": "session", "qwen": "round_robin"}
    for m in cont["volumeMounts"]:
        if not m["name"].startswith("config-"):
            continue
        which = m["name"][len("config-"):]
        assert vols[m["name"]]["configMap"]["name"].startswith(f"{RELEASE}-anchorage-{which}")
        mount = tmp_path / m["mountPath"].lstrip("/")
        stamp = mount / "..2026_12_01_12_00_00.1"
        stamp.mkdir(parents=True)
        (stamp / "anchorage.yaml").write_text(
            f"generation: 1\npolicy: {{name: hybrid}}\n"
            f"routing: {{policy: {policies[which]}, weights: {{}}}}\n...\n")
        (mount / "..data").symlink_to(stamp.name)
        (mount / "anchorage.yaml").symlink_to("..data/anchorage.yaml")
    s = RoutingState(RouterConfig(replicas=["http://127.0.0.1:1"]).validate())
    w = ConfigWatch(s, directory=str(tmp_path / config_dir.lstrip("/")))
    w.poll()
    assert w.status() == {"generation": {"meta-llama/Llama-3.1-8B": 1, "qwen": 1}, "errors": {}}
    assert s.policy_for("meta-llama/Llama-3.1-8B") == "session"
    assert s.policy_for("qwen") == "round_robin"
    assert s.policy_for("llama") == s.policy_for(None)      # not a name requests carry
