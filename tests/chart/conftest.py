"""Helpers for the Helm chart tests: render charts/anchorage offline (helm-python-sdk) with
chosen Kubernetes capabilities, and the values that switch every optional feature on."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, need_module

CHART = REPO / "charts" / "anchorage"
RELEASE, NAMESPACE = "anc", "llm"

# What a cluster with the Prometheus Operator (and policy/v1) serves, for `auto` features.
MONITORING_APIS = ["monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
                   "monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/PrometheusRule"]


# The image repositories every render passes: the chart has none by default (the images are
# not published; templates/_validate.tpl refuses to render without them).
IMAGES = {"image": {"repository": "registry.test/ml/anchorage"},
          "router": {"image": {"repository": "registry.test/ml/anchorage-router"}},
          "modelDefaults": {"image": {"repository": "registry.test/ml/vllm-anchorage"}}}


def overlay(base: dict, over: dict) -> dict:
    """``over`` laid over ``base``: maps merged key by key, as Helm merges values files."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = overlay(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else copy.deepcopy(v)
    return out


def with_images(values: dict | None) -> dict:
    """``values`` laid over IMAGES."""
    return overlay(IMAGES, values or {})


def model(name: str, **over) -> dict:
    m = {"name": name, "model": f"org/{name}", "image": {"repository": "vllm-anchorage", "tag": "0.32.0"}}
    m.update(over)
    return m


def all_on_values() -> dict:
    """Every optional feature on: two models (TP 2, prefix-aware scheduler, HF token secret,
    a PVC cache, fixed replicas), namespaced operator with peering, KubeRay router with a
    worker group, forced monitors and rules, dashboards in another namespace, network
    policy peers, all PDBs."""
    return {
        "commonLabels": {"team": "llm"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {"replicaCount": 3, "watchNamespaces": ["llm", "agents"], "logLevel": "debug",
                     "extraArgs": ["--verbose"], "extraEnv": [{"name": "X", "value": "1"}],
                     "nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "k", "operator": "Exists"}],
                     "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                         {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                           "labelSelector": {"matchLabels": {"a": "b"}}}}]}},
                     "podAnnotations": {"a": "b"}},
        "router": {"policy": "prefix", "policyParams": {"balance_abs_threshold": 8}, "retries": 1,
                   "maxBodyBytes": 1_048_576, "podDisruptionBudget": {"enabled": True},
                   "service": {"type": "LoadBalancer", "annotations": {"lb": "internal"}},
                   "kuberay": {"enabled": True, "workerGroups": [{"name": "workers", "replicas": 2,
                                                                 "minReplicas": 1, "maxReplicas": 4}]}},
        "nodeAgent": {"warmup": False, "accessLogSampleRate": 0.5, "extraArgs": ["--x"]},
        "models": [
            model("llama-70b", tensorParallelSize=2, scheduler="prefix-aware", tiering="spatial", maxModelLen=32768,
                  hfTokenSecret={"name": "hf", "key": "token"}, modelCache={"existingClaim": "weights"},
                  extraArgs=["--max-num-seqs=64"], extraEnv=[{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}],
                  agentCachePolicy={"enabled": True, "spec": {"autoscaling": {"enabled": False}, "replicas": 2}},
                  replicas=2),
            model("qwen-7b", policy="cachewise", servedModelName="qwen", vllmPlugins="anchorage,other",
                  tiering="temporal", hostOffload={"memoryGiB": 32},
                  agentCachePolicy={"enabled": True, "spec": {
                      "routing": {"policy": "composite", "weights": {"session": 2.0, "prefix": 1.0}},
                      "autoscaling": {"minReplicas": 2, "maxReplicas": 6, "targetHitRate": 0.7},
                      "tuning": {"enabled": True, "intervalSeconds": 600}}}),
        ],
        "monitoring": {"serviceMonitors": True, "prometheusRule": True, "labels": {"release": "kps"}},
        "dashboards": {"namespace": "monitoring", "folder": "LLM"},
        "networkPolicy": {"routerFrom": [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}],
                          "modelsFrom": [{"podSelector": {"matchLabels": {"role": "batch"}}}]},
    }


def deployment_router_values() -> dict:
    """Every optional feature of the non-KubeRay router (Ray head Deployment + Service)."""
    v = all_on_values()
    v["router"]["kuberay"] = {"enabled": False}
    v["router"]["discovery"] = {"mode": "static", "staticReplicas": ["http://10.0.0.5:8000"]}
    return v


def render(values: dict | None = None, *, api_versions: list[str] | None = None,
           kube_version: str | None = None, namespace: str = NAMESPACE,
           release: str = RELEASE, images: bool = True) -> dict[str, str]:
    """Template path -> rendered text. ``api_versions`` are added to Helm's offline defaults
    (the Python wrapper does not expose them, so the C ABI is called with its options).
    ``images``: lay ``values`` over IMAGES (False: exactly ``values``)."""
    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    from helm_python import Chart, _native

    chart = Chart.load(str(CHART))
    opts: dict = {"name": release, "namespace": namespace}
    if api_versions:
        opts["api_versions"] = api_versions
    if kube_version:
        opts["kube_version"] = kube_version
    vals = with_images(values) if images else (values or {})
    out = _native.call_string("helm_render", chart._raw(), json.dumps(vals), json.dumps(opts))
    return json.loads(out)


def objects(rendered: dict[str, str]) -> list[dict]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def crd_files() -> list[Path]:
    return sorted((CHART / "crds").glob("*.yaml"))


@pytest.fixture(scope="module")
def default_objects() -> list[dict]:
    return objects(render({}))


@pytest.fixture(scope="module")
def all_on_objects() -> list[dict]:
    return objects(render(all_on_values(), api_versions=MONITORING_APIS))


# Kinds whose schemas are not Kubernetes built-ins: checked against the CRDs we ship
# (AgentCachePolicy, kopf peerings) or structurally (Prometheus Operator, KubeRay).
CUSTOM_KINDS = {"AgentCachePolicy", "ClusterKopfPeering", "KopfPeering", "ServiceMonitor",
                "PodMonitor", "PrometheusRule", "RayService"}


def k8s_validate(docs: list[dict]) -> int:
    """Validate built-in objects against the newest Kubernetes schemas kubernetes-validate
    ships (--strict: unknown fields are errors); returns how many were checked."""
    need_module("kubernetes_validate", "kubernetes-validate (pip install kubernetes-validate)")
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    version = latest_version()
    checked = 0
    for d in docs:
        if d["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as e:  # pragma: no cover - the failure path
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} invalid for Kubernetes {version}: "
                        f"{e.message}")
        checked += 1
    return checked


def crd_schema(kind: str) -> dict:
    for f in crd_files():
        for crd in yaml.safe_load_all(f.read_text()):
            if crd["spec"]["names"]["kind"] == kind:
                return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    raise AssertionError(f"no CRD for {kind} in {CHART / 'crds'}")


def deep(d: dict, *path, default=None):
    for p in path:
        if not isinstance(d, (dict, list)):
            return default
        try:
            d = d[p]
        except (KeyError, IndexError, TypeError):
            return default
    return copy.deepcopy(d)
