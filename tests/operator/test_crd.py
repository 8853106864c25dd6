"""The AgentCachePolicy CRD offline: structural (every node typed), defaults valid, no
features newer than Kubernetes 1.20, and the example validates against the schema."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd" / "agentcachepolicies.anchorage.dev.yaml"
EXAMPLE = REPO / "manifests" / "examples" / "agentcachepolicy.yaml"


@pytest.fixture(scope="module")
def crd():
    return yaml.safe_load(CRD.read_text())


def _version(crd):
    (v,) = crd["spec"]["versions"]
    return v


def _walk(node, path="$"):
    yield path, node
    for k, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_structural_and_1_20_compatible(crd):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["names"]["shortNames"] == ["acp"]
    v = _version(crd)
    assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
    assert v["subresources"]["status"] == {}
    assert v["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    cols = {c["name"]: c["jsonPath"] for c in v["additionalPrinterColumns"]}
    assert cols["Policy"] == ".spec.policy.name" and cols["Replicas"] == ".status.replicas"
    assert cols["Hit Rate"] == ".status.hitRate" and cols["Age"] == ".metadata.creationTimestamp"
    schema = v["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "x-kubernetes-validations" not in node, path  # CEL is 1.25+
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if "default" in node:
            jsonschema.validate(node["default"], {k: v for k, v in node.items()
                                                  if k not in ("default", "description")})
    # enums and parameter names against the registries and the parameter table:
    # tests/config/test_document.py and tests/config/test_parameters.py


def test_example_validates_and_schema_rejects_nonsense(crd):
    schema = _version(crd)["schema"]["openAPIV3Schema"]
    example = yaml.safe_load(EXAMPLE.read_text())
    jsonschema.validate(example, schema)
    bad = yaml.safe_load(EXAMPLE.read_text())
    bad["spec"]["autoscaling"]["targetHitRate"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
