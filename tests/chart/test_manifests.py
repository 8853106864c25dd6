"""manifests/: generated files are up to date with the chart, the kustomizations build, and
every object validates (built-ins with kubernetes-validate --strict, AgentCachePolicies with
the CRD's schema)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.chart.conftest import crd_schema, k8s_validate
from tests.conftest import REPO, need, need_module

MANIFESTS = REPO / "manifests"


def test_generated_manifests_up_to_date():
    need_module("helm_python", "helm-python-sdk")
    r = subprocess.run([sys.executable, str(MANIFESTS / "build.py"), "--check"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def _kustomize(path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl (with its built-in kustomize)", "install kubectl")
    r = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.mark.parametrize("path", ["", "examples/llm"])
def test_kustomizations_build_and_validate(path):
    import jsonschema

    docs = _kustomize(MANIFESTS / path)
    custom = [d for d in docs if d["kind"] == "AgentCachePolicy"]
    builtin = [d for d in docs if d["kind"] not in ("AgentCachePolicy", "ClusterKopfPeering")]
    assert k8s_validate(builtin) == len(builtin)
    for d in custom:
        jsonschema.validate(d, crd_schema("AgentCachePolicy"))
    kinds = {d["kind"] for d in docs}
    if path == "":
        assert {"CustomResourceDefinition", "Namespace", "Deployment", "ClusterRole",
                "ClusterRoleBinding", "ServiceAccount", "ClusterKopfPeering"} <= kinds
        dep = next(d for d in docs if d["kind"] == "Deployment")
        assert dep["metadata"]["namespace"] == "anchorage-system"
        assert not any("helm.sh/chart" in (d["metadata"].get("labels") or {}) for d in docs)
    else:
        assert {"Deployment", "Service", "AgentCachePolicy", "NetworkPolicy"} <= kinds
        assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"llm"}


def test_example_policies_valid():
    import jsonschema

    files = sorted(MANIFESTS.glob("examples/*.yaml"))
    assert len(files) >= 3
    for f in files:
        for d in yaml.safe_load_all(f.read_text()):
            assert d["kind"] == "AgentCachePolicy", f
            jsonschema.validate(d, crd_schema("AgentCachePolicy"))
