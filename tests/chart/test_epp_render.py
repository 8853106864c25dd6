"""The chart's endpoint-picker block (``epp``): off by default; on, an InferencePool per
model that is valid for the Inference Extension's own CRD (tests/data/crds, v1.6.0) and
selects that model's pods on their engine port, its picker Deployment/Service (the
InferencePool's ``endpointPickerRef``), least-privilege RBAC, the HTTPRoute from the
user's gateway (valid for Gateway API v1.6.1's CRD), and every value reaching `anchorage router --mode epp` through the real
CLI parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chart.conftest import by_kind, k8s_validate, model, objects, one, render

CRD = Path(__file__).resolve().parents[1] / "data" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
ROUTE_CRD = CRD.parent / "gateway.networking.k8s.io_httproutes.yaml"
GW = [{"name": "inference-gateway", "namespace": "gateway-system"}]


def on(**epp) -> dict:
    e = {"enabled": True, "route": {"parentRefs": GW}}
    for k, v in epp.items():
        e[k] = {**e.get(k, {}), **v} if isinstance(v, dict) and isinstance(e.get(k), dict) else v
    return {"epp": e}


def pool_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def route_schema() -> dict:
    crd = yaml.safe_load(ROUTE_CRD.read_text())
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def validate_pool(pool: dict) -> None:
    """The CRD's OpenAPI schema, and its two CEL rules the schema alone cannot say."""
    import jsonschema
    jsonschema.Draft7Validator(pool_schema()).validate(pool)
    ports = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(ports) == len(set(ports)), "port number must be unique"
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref, \
        "port is required when kind is 'Service' or unspecified"


def _container(dep: dict, name: str | None = None) -> dict:
    cs = dep["spec"]["template"]["spec"]["containers"]
    return cs[0] if name is None else next(c for c in cs if c["name"] == name)


def test_off_by_default_and_the_router_stays():
    docs = objects(render({}))
    assert not by_kind(docs, "InferencePool") and not by_kind(docs, "HTTPRoute")
    assert not [d for d in docs if d["metadata"]["name"].endswith("-epp")]
    one(docs, "Deployment", "-router")
    docs = objects(render(on()))
    one(docs, "Deployment", "-router")           # the Ray Serve router is still rendered


def test_an_inferencepool_per_model_valid_for_the_crd_selecting_its_engine_pods():
    docs = objects(render({**on(), "models": [model("llama"), model("qwen")]}))
    pools = by_kind(docs, "InferencePool")
    assert [p["metadata"]["name"] for p in pools] == ["anc-anchorage-llama", "anc-anchorage-qwen"]
    for p in pools:
        assert p["apiVersion"] == "inference.networking.k8s.io/v1"
        validate_pool(p)
        name = p["metadata"]["name"]
        dep = one(docs, "Deployment", name.removeprefix("anc-anchorage"))
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert p["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # the other model's pods are not selected
        other = [d for d in by_kind(docs, "Deployment") if d is not dep and
                 d["metadata"]["name"].startswith("anc-anchorage-") and
                 p["spec"]["selector"]["matchLabels"].items() <=
                 d["spec"]["template"]["metadata"]["labels"].items()]
        assert not other
        ports = {pt["containerPort"] for c in dep["spec"]["template"]["spec"]["containers"]
                 for pt in c.get("ports", []) if pt.get("name") == "http"}
        assert [t["number"] for t in p["spec"]["targetPorts"]] == sorted(ports) == [8000]
        # its picker: the Service the ref names, on its gRPC port, selecting its pods only
        ref = p["spec"]["endpointPickerRef"]
        svc = one(docs, "Service", ref["name"].removeprefix("anc-anchorage"))
        assert svc["metadata"]["name"] == ref["name"]
        grpc = next(pt for pt in svc["spec"]["ports"] if pt["name"] == "grpc")
        assert grpc["port"] == ref["port"]["number"] == 9002
        assert "appProtocol" not in grpc                # TLS by default (epp.tls)
        epp = one(docs, "Deployment", ref["name"].removeprefix("anc-anchorage"))
        assert svc["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
        assert ref["failureMode"] == "FailClose"
    # the CRD really rejects what it must (the validator is not vacuous)
    import jsonschema
    bad = pools[0] | {"spec": {**pools[0]["spec"], "targetPorts": []}}
    with pytest.raises(jsonschema.ValidationError):
        validate_pool(bad)


def test_every_epp_value_reaches_the_picker_through_the_cli():
    from anchorage.cli import build_parser
    from anchorage.commands.router import make_config, make_epp_config

    values = {**on(replicaCount=2, grpcPort=9102, healthPort=9103, metricsPort=9190,
                   fallbacks=3, failureMode="FailOpen", extraArgs=["--vocab-size=32000"]),
              "router": {"policy": "prefix", "policyParams": {"balance_abs_threshold": 8},
                         "blockSize": 32, "maxBodyBytes": 2_000_000, "maxInflightPerReplica": 7}}
    docs = objects(render(values))
    dep = one(docs, "Deployment", "-qwen-7b-epp")
    assert dep["spec"]["replicas"] == 2
    c = _container(dep)
    args = build_parser().parse_args(c["args"])
    e, r = make_epp_config(args), make_config(args)
    assert (e.port, e.health_port, e.metrics_port, e.fallbacks) == (9102, 9103, 9190, 3)
    assert e.tls and not e.tls_cert_file                  # epp.tls (default): self-signed
    assert e.pool_name == "anc-anchorage-qwen-7b" and e.pool_namespace == "llm"
    assert e.leader_election and e.lease_name == "anc-anchorage-qwen-7b-epp"
    assert r.discovery == "inferencepool" and r.config_dir == "/etc/anchorage/models"
    assert (r.policy, r.policy_params, r.block_size, r.max_body_bytes,
            r.max_inflight_per_replica, r.vocab_size) == ("prefix", {"balance_abs_threshold": 8},
                                                          32, 2_000_000, 7, 32000)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 9102, "grpc-health": 9103, "metrics": 9190}
    assert c["readinessProbe"]["grpc"] == {"port": 9103, "service": "readiness"}
    assert c["livenessProbe"]["grpc"] == {"port": 9103, "service": "liveness"}
    env = {x["name"]: x.get("valueFrom") for x in c["env"]}
    assert "secretKeyRef" in env["ANCHORAGE_TENANT_SECRET"]     # the router's tenant key
    pool = one(docs, "InferencePool")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == 9102
    # one replica: no election, no Lease rights
    single = objects(render(on()))
    a1 = build_parser().parse_args(_container(one(single, "Deployment", "-epp"))["args"])
    assert not make_epp_config(a1).leader_election
    plain = objects(render(on(tls=False)))
    a2 = build_parser().parse_args(_container(one(plain, "Deployment", "-epp"))["args"])
    assert not make_epp_config(a2).tls
    svc = one(plain, "Service", "-epp")
    assert svc["spec"]["ports"][0]["appProtocol"] == "kubernetes.io/h2c"
    assert not any("leases" in rule["resources"] for rule in one(single, "Role", "-epp")["rules"])


def _rules(role: dict) -> set:
    return {(g, r, v, tuple(rule.get("resourceNames", ())))
            for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_rbac_is_least_privilege():
    docs = objects(render({**on(replicaCount=2), "models": [model("a"), model("b")]}))
    role = one(docs, "Role", "-epp")
    pools = ("anc-anchorage-a", "anc-anchorage-b")
    leases = ("anc-anchorage-a-epp", "anc-anchorage-b-epp")
    assert _rules(role) == {
        ("inference.networking.k8s.io", "inferencepools", "get", pools),
        ("", "pods", "get", ()), ("", "pods", "list", ()), ("", "pods", "watch", ()),
        ("coordination.k8s.io", "leases", "get", leases),
        ("coordination.k8s.io", "leases", "update", leases),
        ("coordination.k8s.io", "leases", "create", ())}
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")
                and "epp" in d["metadata"]["name"]]
    rb = one(docs, "RoleBinding", "-epp")
    dep = one(docs, "Deployment", "-a-epp")
    assert rb["subjects"][0]["name"] == dep["spec"]["template"]["spec"]["serviceAccountName"]


def test_the_httproute_attaches_to_the_users_gateway_and_routes_to_the_pools():
    docs = objects(render(on(route={"hostnames": ["llm.example.com"], "timeout": "300s"})))
    import jsonschema
    route = one(docs, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    jsonschema.Draft7Validator(route_schema()).validate(route)   # Gateway API v1.6.1's CRD
    assert route["spec"]["parentRefs"] == GW and route["spec"]["hostnames"] == ["llm.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                    "name": one(docs, "InferencePool")["metadata"]["name"]}]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["timeouts"] == {"request": "300s"}
    # several models: one rule per model, by the model header the gateway's BBR sets
    two = objects(render({**on(), "models": [model("a"), model("b", servedModelName="bee")]}))
    jsonschema.Draft7Validator(route_schema()).validate(one(two, "HTTPRoute"))
    bad = one(two, "HTTPRoute") | {"spec": {"parentRefs": GW, "rules": [{"backendRefs": [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool"}]}]}}
    with pytest.raises(jsonschema.ValidationError):          # (a backendRef needs a name)
        jsonschema.Draft7Validator(route_schema()).validate(bad)
    rules = one(two, "HTTPRoute")["spec"]["rules"]
    assert [(r["matches"][0]["headers"][0]["value"], r["backendRefs"][0]["name"]) for r in rules] \
        == [("a", "anc-anchorage-a"), ("bee", "anc-anchorage-b")]
    assert rules[0]["matches"][0]["headers"][0]["name"] == "X-Gateway-Model-Name"
    assert not by_kind(objects(render(on(route={"enabled": False}))), "HTTPRoute")


def test_a_route_without_a_gateway_is_a_clear_error():
    with pytest.raises(Exception, match="epp.route.parentRefs"):
        render({"epp": {"enabled": True}})
    with pytest.raises(Exception, match="values don't meet the specifications|failureMode"):
        render(on(failureMode="Sometimes"))


def test_network_policies_let_the_pickers_read_the_engines_and_the_gateway_call_them():
    docs = objects(render(on() | {"networkPolicy": {"eppFrom": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}}}]}}))
    models = one(docs, "NetworkPolicy", "-models")
    peers = models["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "anchorage",
                                            "app.kubernetes.io/instance": "anc",
                                            "app.kubernetes.io/component": "epp"}}} in peers
    np = one(docs, "NetworkPolicy", "-epp")
    grpc = np["spec"]["ingress"][0]
    assert grpc["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert grpc["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "gateway-system"}
    off = objects(render({}))
    assert not [p for p in by_kind(off, "NetworkPolicy") if p["metadata"]["name"].endswith("-epp")]


def test_the_picker_objects_are_valid_kubernetes_objects():
    docs = objects(render({**on(replicaCount=2), "models": [model("a"), model("b")]}))
    mine = [d for d in docs if d["kind"] not in ("InferencePool", "HTTPRoute")
            and "epp" in d["metadata"]["name"]]
    assert {d["kind"] for d in mine} == {"ServiceAccount", "Role", "RoleBinding", "Deployment",
                                         "Service", "NetworkPolicy"}
    assert k8s_validate(mine) == len(mine)


def test_epp_values_lint_clean():
    from helm_python import lint

    from tests.chart.conftest import CHART
    values = {**on(replicaCount=2, route={"hostnames": ["llm.example.com"], "timeout": "300s"}),
              "models": [model("a"), model("b")]}
    report = lint(str(CHART), values, strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


def test_decision_sharing_reaches_the_picker_and_needs_the_token():
    from anchorage.cli import build_parser
    from anchorage.commands.router import make_epp_config

    token = [{"name": "ANCHORAGE_INTERNAL_TOKEN",
              "valueFrom": {"secretKeyRef": {"name": "epp-token", "key": "token"}}}]
    docs = objects(render(on(replicaCount=2, shareDecisions=True, extraEnv=token)))
    c = _container(one(docs, "Deployment", "-epp"))
    e = make_epp_config(build_parser().parse_args(c["args"]))
    assert e.leader_election and e.peer_selector == (
        "app.kubernetes.io/instance=anc,app.kubernetes.io/component=epp,"
        "anchorage.dev/model=qwen-7b")
    dep = one(docs, "Deployment", "-epp")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in (x.split("=") for x in e.peer_selector.split(",")))
    env = {x["name"] for x in c["env"]}
    assert {"ANCHORAGE_INTERNAL_TOKEN", "POD_IP"} <= env
    np = one(docs, "NetworkPolicy", "-epp")
    peers = np["spec"]["ingress"][1]["from"]
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "anchorage",
                                            "app.kubernetes.io/instance": "anc",
                                            "app.kubernetes.io/component": "epp"}}} in peers
    with pytest.raises(Exception, match="ANCHORAGE_INTERNAL_TOKEN"):
        render(on(replicaCount=2, shareDecisions=True))
    # one picker, or sharing off: no peers
    for v in (on(shareDecisions=True, extraEnv=token), on(replicaCount=2)):
        c = _container(one(objects(render(v)), "Deployment", "-epp"))
        assert not make_epp_config(build_parser().parse_args(c["args"])).peer_selector
