"""The configuration document (anchorage.config.document): render/parse round trip, the
strict rules (each refusal names its field), and the enums the CRD and the chart's values
schema offer against the registries they name (the tests fail when either drifts)."""

from __future__ import annotations

import json

import pytest
import yaml

from anchorage.config import (ConfigDocument, ConfigError, PolicyParameters, PolicySection,
                              RoutingSection, Source, Target, parse, render, scorer_names)
from anchorage.policies.registry import policy_names
from anchorage.routing import make_router, router_names
from tests.conftest import REPO

CRD = REPO / "manifests" / "crd" / "agentcachepolicies.anchorage.dev.yaml"
VALUES_SCHEMA = REPO / "charts" / "anchorage" / "values.schema.json"


def _doc(**over) -> ConfigDocument:
    base = dict(generation=3, policy=PolicySection("hybrid", PolicyParameters(
                    horizon_s=120, r_min=0.6, prefetch_enabled=True, prefetch_rate_per_s=4),
                    "tuner"),
                routing=RoutingSection("composite", {"prefix": 2, "queue": 1}, {"seed": 1}),
                target=Target("Deployment", "llama"), source=Source("llm", "llama", 7))
    base.update(over)
    return ConfigDocument(**base)


def test_render_parse_round_trip_and_yaml_shape():
    doc = _doc()
    text = render(doc)
    assert parse(text) == doc
    assert text.rstrip().endswith("\n...")
    y = yaml.safe_load(text)
    assert y["policy"] == {"name": "hybrid", "parametersSource": "tuner", "parameters": {
        "horizon": 120, "rMin": 0.6, "prefetch": {"enabled": True, "ratePerSecond": 4}}}
    assert y["routing"] == {"policy": "composite", "weights": {"prefix": 2.0, "queue": 1.0},
                            "parameters": {"seed": 1}}
    assert y["source"]["observedGeneration"] == 7


def test_router_gets_its_policy_and_parameters():
    r = _doc().routing
    assert r.router_kwargs() == {"seed": 1, "scorers": {"prefix": 2.0, "queue": 1.0}}
    router = make_router(r.policy, **r.router_kwargs())
    assert sorted(w for w, _ in router.scorers) == [1.0, 2.0]
    assert RoutingSection("agent", {}, {"locality": 2.0}).problems() == []
    assert "bad parameters for router 'agent'" in RoutingSection("agent", {}, {"nope": 1}).problems()[0]


def test_content_ignores_generation_and_source():
    assert _doc().content() == _doc(generation=9, source=None).content()
    assert _doc().content() != _doc(target=Target("StatefulSet", "llama")).content()


def test_from_spec_defaults_and_errors_name_the_spec_field():
    doc = ConfigDocument.from_spec({"targetRef": {"name": "x"}})
    assert (doc.policy.name, doc.routing.policy, doc.target) == ("hybrid", "agent",
                                                                 Target("Deployment", "x"))
    with pytest.raises(ConfigError, match=r"^spec\.routing\.weights\.load: not a scorer"):
        ConfigDocument.from_spec({"routing": {"policy": "composite", "weights": {"load": 1}}})
    with pytest.raises(ConfigError, match=r"^spec\.policy\.parameters\.horizon: must be in"):
        ConfigDocument.from_spec({"policy": {"parameters": {"horizon": -1}}})
    assert PolicySection("lru", PolicyParameters(horizon_s=3)).problems() == [
        "policy.parameters: policy 'lru' does not accept parameter 'horizon_s'"]


@pytest.mark.parametrize("mutate, problem", [
    (lambda t: t[: t.index("routing:")], "does not end with the end marker"),
    (lambda t: t.replace("\n...\n", "\n"), "does not end with the end marker"),
    (lambda t: "", "the document is empty"),
    (lambda t: "  \n...\n", "the document is empty"),
    (lambda t: t.replace("horizon: 120", "horizon: 0"), "policy.parameters.horizon: must be in (0, inf]"),
    (lambda t: t.replace("horizon: 120", "horizon: soon"), "policy.parameters.horizon: must be a number"),
    (lambda t: t.replace("enabled: true", "enabled: 1"), "policy.parameters.prefetch.enabled: must be true or false"),
    (lambda t: t.replace("parametersSource: tuner", "parametersSource: me"), "policy.parametersSource"),
    (lambda t: t.replace("policy: composite", "policy: bogus"), "routing.policy: 'bogus' is not a known router"),
    (lambda t: t.replace("policy: composite", "policy: agent"), "routing.weights: scorer weights apply to the composite router only"),
    (lambda t: t.replace("prefix: 2.0", "prefix: -2"), "routing.weights.prefix: must be a number >= 0"),
    (lambda t: t.replace("  kind: Deployment", "  kind: Deployment\n  replicas: 2"), "target.replicas: unknown field"),
    (lambda t: t.replace("name: llama\n", "name: ''\n", 1), "source.name: must be a non-empty string"),
    (lambda t: t.replace("generation: 3", "generation: 3.5"), "generation: must be a non-negative integer"),
])
def test_strict_rules(mutate, problem):
    text = mutate(render(_doc()))
    with pytest.raises(ConfigError) as e:
        parse(text)
    assert problem in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def _crd_spec() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_crd_enums_are_the_registries():
    spec = _crd_spec()
    assert sorted(spec["policy"]["properties"]["name"]["enum"]) == sorted(
        policy_names(include_offline=False))
    assert sorted(spec["routing"]["properties"]["policy"]["enum"]) == sorted(router_names())
    # the weights' documented names are the composite router's scorers, and only those
    desc = spec["routing"]["properties"]["weights"]["description"]
    listed = desc.split("by scorer name:")[1].split("(")[0].strip().rstrip(".").split(", ")
    assert listed == scorer_names()
    assert spec["routing"]["properties"]["parameters"]["x-kubernetes-preserve-unknown-fields"]


def test_chart_values_schema_enums_are_the_registries():
    schema = json.loads(VALUES_SCHEMA.read_text())["properties"]
    online = sorted(policy_names(include_offline=False))
    assert sorted(schema["router"]["properties"]["policy"]["enum"]) == sorted(router_names())
    for where in (schema["modelDefaults"], schema["models"]["items"]):
        enum = where["properties"]["policy"]["enum"]
        assert sorted(e for e in enum if e != "off") == online and "off" in enum


def test_every_example_policy_makes_a_valid_document():
    from anchorage.operator.reconcile import document_problems

    for f in sorted((REPO / "manifests" / "examples").glob("*.yaml")):
        for obj in yaml.safe_load_all(f.read_text()):
            if obj and obj.get("kind") == "AgentCachePolicy":
                assert document_problems(obj["spec"]) == [], f.name
