"""EPP discovery: the endpoints of an ``InferencePool`` (inference.networking.k8s.io/v1).

The pool names its members by ``spec.selector.matchLabels`` (Pods in the pool's
namespace) and ``spec.targetPorts[].number``; every ``podIP:port`` of a Ready pod is one
endpoint (the Inference Extension's rule: GAIE ``api/v1/inferencepool_types.go``; its
reference picker ``pkg/lwepp/util/pod``: a pod counts when it has an IP, is not being
deleted and its ``Ready`` condition is ``True``).

- ``pool_endpoints(pool, pods)``: the pure translation -> (sorted URLs, URL -> pod name);
- ``PoolSource(api, namespace, name).watch(on_change)``: get the pool, list its pods, then
  follow a pod watch from the list's resourceVersion; every ``pool_every_s`` (and after a
  watch ends or fails) the pool is read again, so a changed selector or port list is
  followed. ``on_change(urls, names)`` runs on every change (first call: the initial
  state, which marks the EPP synced);
- ``KubePoolAPI``: that interface over the official client (RBAC: ``inferencepools`` get,
  ``pods`` list and watch, in the pool's namespace).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Iterator, Protocol

log = logging.getLogger("anchorage.router.pool")

GROUP, VERSION, PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"


def selector_of(pool: dict[str, Any]) -> dict[str, str]:
    sel = ((pool.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not isinstance(sel, dict) or not sel:
        raise ValueError("the InferencePool has no spec.selector.matchLabels")
    return {str(k): str(v) for k, v in sel.items()}


def ports_of(pool: dict[str, Any]) -> list[int]:
    ports = [p.get("number") for p in (pool.get("spec") or {}).get("targetPorts") or ()
             if isinstance(p, dict)]
    ports = [int(p) for p in ports if isinstance(p, int) and 0 < p < 65536]
    if not ports:
        raise ValueError("the InferencePool has no spec.targetPorts")
    return list(dict.fromkeys(ports))


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def pod_ready(pod: dict[str, Any]) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or ())


def pool_endpoints(pool: dict[str, Any], pods: list[dict[str, Any]],
                   scheme: str = "http") -> tuple[list[str], dict[str, str]]:
    labels, ports = selector_of(pool), ports_of(pool)
    urls: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        have = meta.get("labels") or {}
        if any(have.get(k) != v for k, v in labels.items()) or not pod_ready(pod):
            continue
        ip = pod["status"]["podIP"]
        host = f"[{ip}]" if ":" in ip else ip
        for port in ports:
            urls[f"{scheme}://{host}:{port}"] = meta.get("name", "")
    return sorted(urls), urls


class PoolAPI(Protocol):
    def get_pool(self, namespace: str, name: str) -> dict: ...

    def list_pods(self, namespace: str, selector: str) -> tuple[list[dict], str]: ...

    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout_s: int) -> Iterator[dict]: ...


class PoolSource:
    def __init__(self, api: PoolAPI, namespace: str, name: str, pool_every_s: int = 30) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self.pool_every_s = pool_every_s
        self._stop = threading.Event()

    def watch(self, on_change: Callable[[list[str], dict[str, str]], None]) -> None:
        last: list[str] | None = None
        while not self._stop.is_set():
            try:
                pool = self.api.get_pool(self.namespace, self.name)
                sel = selector_string(selector_of(pool))
                pods, rv = self.api.list_pods(self.namespace, sel)
                by_name = {(p.get("metadata") or {}).get("name", ""): p for p in pods}

                def emit() -> None:
                    nonlocal last
                    urls, names = pool_endpoints(pool, list(by_name.values()))
                    if urls != last:
                        on_change(urls, names)
                        last = urls
                emit()
                started = time.monotonic()
                for ev in self.api.watch_pods(self.namespace, sel, rv, self.pool_every_s):
                    if self._stop.is_set():
                        return
                    o = ev.get("object") or {}
                    key = (o.get("metadata") or {}).get("name", "")
                    if ev.get("type") == "DELETED":
                        by_name.pop(key, None)
                    elif ev.get("type") in ("ADDED", "MODIFIED"):
                        by_name[key] = o
                    else:
                        break                  # ERROR (410 Gone...): list again
                    emit()
                if time.monotonic() - started < 1.0:
                    self._stop.wait(1.0)
            except Exception as exc:  # noqa: BLE001 - keep the picker alive; retry
                log.warning("InferencePool %s/%s discovery failed (%s); retrying",
                            self.namespace, self.name, exc)
                self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()


class KubePoolAPI:
    """``PoolAPI`` over the official ``kubernetes`` client (in-cluster or kubeconfig)."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        from anchorage.router.discovery import kube_api_client

        api_client = kube_api_client(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def get_pool(self, namespace: str, name: str) -> dict:
        res = self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                        _preload_content=False)
        return json.loads(res.data)

    def list_pods(self, namespace: str, selector: str) -> tuple[list[dict], str]:
        res = self._core.list_namespaced_pod(namespace, label_selector=selector,
                                             _preload_content=False)
        body = json.loads(res.data)
        return body.get("items") or [], (body.get("metadata") or {}).get("resourceVersion", "")

    def watch_pods(self, namespace: str, selector: str, resource_version: str,
                   timeout_s: int) -> Iterator[dict]:
        from kubernetes import watch
        w = watch.Watch()
        for ev in w.stream(self._core.list_namespaced_pod, namespace, label_selector=selector,
                           resource_version=resource_version, timeout_seconds=timeout_s,
                           _preload_content=False):
            yield {"type": ev["type"], "object": ev["raw_object"]}
