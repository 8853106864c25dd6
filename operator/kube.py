"""Kubernetes I/O the reconcile pass needs: the target's scale subresource and ConfigMaps.

Thin over the official ``kubernetes`` client (blocking; kopf runs sync handlers in a thread
pool). Missing objects are ``None``, not exceptions; other API errors propagate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException


@dataclass(frozen=True)
class Scale:
    spec_replicas: int
    status_replicas: int
    selector: str


class KubeIO:
    def __init__(self, api_client: client.ApiClient | None = None):
        self.api = api_client or client.ApiClient()
        self.apps = client.AppsV1Api(self.api)
        self.core = client.CoreV1Api(self.api)

    def _scale_fns(self, kind: str):
        if kind == "Deployment":
            return (self.apps.read_namespaced_deployment_scale,
                    self.apps.patch_namespaced_deployment_scale)
        if kind == "StatefulSet":
            return (self.apps.read_namespaced_stateful_set_scale,
                    self.apps.patch_namespaced_stateful_set_scale)
        raise ValueError(f"unsupported target kind {kind!r} (Deployment or StatefulSet)")

    def get_scale(self, kind: str, namespace: str, name: str) -> Scale | None:
        read, _ = self._scale_fns(kind)
        try:
            s = read(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return Scale(spec_replicas=s.spec.replicas or 0,
                     status_replicas=(s.status.replicas or 0) if s.status else 0,
                     selector=(s.status.selector or "") if s.status else "")

    def set_replicas(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        _, patch = self._scale_fns(kind)
        patch(name, namespace, {"spec": {"replicas": int(replicas)}})

    def get_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        """What the access-log rule looks at (access_logs.service_problems), or None."""
        try:
            svc = self.core.read_namespaced_service(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        spec = svc.spec
        return {"labels": dict(svc.metadata.labels or {}), "type": spec.type,
                "clusterIP": spec.cluster_ip, "selector": dict(spec.selector or {}),
                "ports": [{"name": p.name, "port": p.port} for p in spec.ports or []]}

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            cm = self.core.read_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {"data": dict(cm.data or {}), "annotations": dict(cm.metadata.annotations or {}),
                "resourceVersion": cm.metadata.resource_version}

    def put_configmap(self, namespace: str, body: dict[str, Any],
                      resource_version: str | None) -> None:
        """Create, or patch at ``resource_version`` (a concurrent writer gets 409)."""
        name = body["metadata"]["name"]
        if resource_version is None:
            self.core.create_namespaced_config_map(namespace, body)
        else:
            body = {**body, "metadata": {**body["metadata"], "resourceVersion": resource_version}}
            self.core.patch_namespaced_config_map(name, namespace, body)
