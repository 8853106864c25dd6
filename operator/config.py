"""The ConfigMap the node agents and the router mount: ``<policy name>-anchorage`` in the
policy's namespace, owned by the AgentCachePolicy (garbage-collected with it), data key
``anchorage.yaml``. Its content is the typed document of ``anchorage.config`` (rendered and
parsed there, for every component); this module only wraps it in a ConfigMap.

Consumers report the ``generation`` they run; the same number is in the annotation
``anchorage.dev/config-generation`` and in the policy's ``status.configGeneration``.
"""

from __future__ import annotations

from typing import Any

from anchorage.config.document import DATA_KEY, GENERATION_ANNOTATION, configmap_name  # noqa: F401


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
