"""Replica discovery: where the upstream vLLM replicas are.

- ``KubernetesSource(api, namespace, selector, port, kind)``: the ready addresses of the
  ``Endpoints`` (core/v1; every server version) or ``EndpointSlice`` (discovery.k8s.io/v1)
  objects matching a label selector, as ``http://<ip>:<port>`` URLs. ``urls_from(objs)`` is
  the pure translation (``pods_from``: the pod behind each URL); ``watch(on_change)`` lists, then follows a watch from the list's
  resourceVersion, re-listing whenever the watch ends or fails (so a missed event cannot
  leave the router stale for longer than one watch timeout).

``api`` is a small interface (``list(namespace, selector) -> (objects, resource_version)``,
``watch(namespace, selector, resource_version, timeout_s) -> iterator of events``);
``KubeClientAPI`` implements it with the official ``kubernetes`` client, and tests may
pass a fake. Objects are plain dicts (the API's JSON).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Protocol

log = logging.getLogger("anchorage.router.discovery")


class EndpointsAPI(Protocol):
    def list(self, namespace: str, selector: str) -> tuple[list[dict], str]: ...

    def watch(self, namespace: str, selector: str, resource_version: str,
              timeout_s: int) -> Iterator[dict]: ...


def pods_from(objs: Iterable[dict[str, Any]], kind: str, port: int,
              scheme: str = "http") -> dict[str, str]:
    """URL -> name of the Pod behind it (the address's ``targetRef``), for ready addresses
    that have one; the router labels a replica's series by it."""
    out: dict[str, str] = {}
    for o in objs:
        if kind == "Endpoints":
            eps = [(a["ip"], a.get("targetRef")) for sub in o.get("subsets") or ()
                   for a in sub.get("addresses") or ()]
        else:
            eps = [(ip, ep.get("targetRef")) for ep in o.get("endpoints") or ()
                   if (ep.get("conditions") or {}).get("ready") is not False
                   for ip in ep.get("addresses") or ()]
        for ip, ref in eps:
            if ref and ref.get("kind") == "Pod" and ref.get("name"):
                out[f"{scheme}://{ip}:{port}"] = ref["name"]
    return out


def urls_from(objs: Iterable[dict[str, Any]], kind: str, port: int, scheme: str = "http") -> list[str]:
    """Ready addresses of Endpoints / EndpointSlice objects, sorted, deduplicated."""
    out: set[str] = set()
    for o in objs:
        if kind == "Endpoints":
            for sub in o.get("subsets") or ():
                for a in sub.get("addresses") or ():      # notReadyAddresses are skipped
                    out.add(f"{scheme}://{a['ip']}:{port}")
        elif kind == "EndpointSlice":
            for ep in o.get("endpoints") or ():
                cond = ep.get("conditions") or {}
                if cond.get("ready") is False:
                    continue
                for ip in ep.get("addresses") or ():
                    out.add(f"{scheme}://{ip}:{port}")
        else:
            raise ValueError(f"kind must be Endpoints or EndpointSlice, not {kind!r}")
    return sorted(out)


class KubernetesSource:
    def __init__(self, api: EndpointsAPI, namespace: str, selector: str, port: int,
                 kind: str = "Endpoints", watch_timeout_s: int = 60) -> None:
        self.api, self.namespace, self.selector = api, namespace, selector
        self.port, self.kind, self.watch_timeout_s = port, kind, watch_timeout_s
        self._objs: dict[str, dict] = {}
        self.pod_names: dict[str, str] = {}   # URL -> pod, as of the last on_change
        self._stop = threading.Event()

    def urls(self) -> list[str]:
        objs, _ = self.api.list(self.namespace, self.selector)
        return urls_from(objs, self.kind, self.port)

    def _key(self, o: dict) -> str:
        return o.get("metadata", {}).get("name", "")

    def watch(self, on_change: Callable[[list[str]], None]) -> None:
        """Block, calling ``on_change(urls)`` on every change, until ``stop()``."""
        last: list[str] | None = None
        while not self._stop.is_set():
            try:
                objs, rv = self.api.list(self.namespace, self.selector)
                self._objs = {self._key(o): o for o in objs}
                cur = urls_from(self._objs.values(), self.kind, self.port)
                if cur != last:
                    self.pod_names = pods_from(self._objs.values(), self.kind, self.port)
                    on_change(cur)
                    last = cur
                started = time.monotonic()
                for ev in self.api.watch(self.namespace, self.selector, rv, self.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    o = ev.get("object") or {}
                    if ev.get("type") == "DELETED":
                        self._objs.pop(self._key(o), None)
                    elif ev.get("type") in ("ADDED", "MODIFIED"):
                        self._objs[self._key(o)] = o
                    else:
                        break          # ERROR (e.g. 410 Gone): re-list
                    cur = urls_from(self._objs.values(), self.kind, self.port)
                    if cur != last:
                        self.pod_names = pods_from(self._objs.values(), self.kind, self.port)
                        on_change(cur)
                        last = cur
                if time.monotonic() - started < 1.0:   # a watch that ends at once: no hot loop
                    self._stop.wait(1.0)
            except Exception as exc:  # noqa: BLE001 - keep the router alive; retry
                log.warning("replica discovery failed (%s); retrying", exc)
                self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()


def kube_api_client(api_client: Any = None) -> Any:
    """``api_client``, else the official client's: in-cluster configuration, else the
    kubeconfig (one home for the router's, the picker's pool and the Lease adapters)."""
    if api_client is not None:
        return api_client
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class KubeClientAPI:
    """``EndpointsAPI`` over the official ``kubernetes`` client (in-cluster or kubeconfig)."""

    def __init__(self, kind: str = "Endpoints", api_client: Any = None) -> None:
        from kubernetes import client

        api_client = kube_api_client(api_client)
        self.kind = kind
        self._client = api_client
        if kind == "Endpoints":
            core = client.CoreV1Api(api_client)
            self._list = core.list_namespaced_endpoints
        else:
            disc = client.DiscoveryV1Api(api_client)
            self._list = disc.list_namespaced_endpoint_slice

    def list(self, namespace: str, selector: str) -> tuple[list[dict], str]:
        res = self._list(namespace, label_selector=selector, _preload_content=False)
        import json
        body = json.loads(res.data)
        return body.get("items") or [], body.get("metadata", {}).get("resourceVersion", "")

    def watch(self, namespace: str, selector: str, resource_version: str,
              timeout_s: int) -> Iterator[dict]:
        from kubernetes import watch
        w = watch.Watch()
        for ev in w.stream(self._list, namespace, label_selector=selector,
                           resource_version=resource_version, timeout_seconds=timeout_s,
                           _preload_content=False):
            yield {"type": ev["type"], "object": ev["raw_object"]}
        time.sleep(0)
