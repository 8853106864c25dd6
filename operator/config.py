"""The effective configuration the node agents and the router mount (pure).

ConfigMap ``<policy name>-anchorage`` in the policy's namespace, owned by the
AgentCachePolicy (garbage-collected with it), data key ``anchorage.yaml``::

    generation: 3                 # bumped whenever the content below changes
    source: {kind: AgentCachePolicy, namespace: llm, name: llama-8b, observedGeneration: 7}
    policy: {name: hybrid, parameters: {...}, parametersSource: spec|tuner}
    routing: {policy: agent, weights: {...}}
    target: {kind: Deployment, name: llama-8b}

Consumers report the ``generation`` they run; the same number is in the annotation
``anchorage.dev/config-generation`` and in the policy's ``status.configGeneration``.
"""

from __future__ import annotations

from typing import Any

import yaml

DATA_KEY = "anchorage.yaml"
GENERATION_ANNOTATION = "anchorage.dev/config-generation"


def configmap_name(policy_name: str) -> str:
    return f"{policy_name}-anchorage"


def effective_content(spec: dict[str, Any], parameters: dict[str, Any], source: str) -> dict[str, Any]:
    """Everything but the generation numbers: compared to decide whether to write."""
    policy = spec.get("policy") or {}
    routing = spec.get("routing") or {}
    target = spec.get("targetRef") or {}
    return {
        "policy": {"name": policy.get("name", "hybrid"), "parameters": parameters,
                   "parametersSource": source},
        "routing": {"policy": routing.get("policy", "agent"),
                    "weights": dict(routing.get("weights") or {})},
        "target": {"kind": target.get("kind", "Deployment"), "name": target.get("name")},
    }


def render(content: dict[str, Any], generation: int, *, namespace: str, name: str,
           observed_generation: int | None) -> str:
    doc = {"generation": generation,
           "source": {"kind": "AgentCachePolicy", "namespace": namespace, "name": name,
                      "observedGeneration": observed_generation},
           **content}
    return yaml.safe_dump(doc, sort_keys=False)


def parse(text: str) -> tuple[int, dict[str, Any]]:
    """(generation, content) of a rendered document; (0, {}) when unreadable."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return 0, {}
    if not isinstance(doc, dict):
        return 0, {}
    gen = doc.get("generation") if isinstance(doc.get("generation"), int) else 0
    return gen, {k: doc[k] for k in ("policy", "routing", "target") if k in doc}


def configmap_body(*, namespace: str, name: str, uid: str, text: str, generation: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(name), "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "anchorage-operator",
                       "anchorage.dev/policy": name},
            "annotations": {GENERATION_ANNOTATION: str(generation)},
            "ownerReferences": [{"apiVersion": "anchorage.dev/v1alpha1",
                                 "kind": "AgentCachePolicy", "name": name, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "data": {DATA_KEY: text},
    }
