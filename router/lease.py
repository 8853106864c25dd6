"""EPP leader election through a ``coordination.k8s.io/v1`` Lease (active-passive, as the
Inference Extension's pickers run several replicas: only the leader is ready, so the
gateway's health check sends every request to one routing state).

``lease_step(spec, me, now, duration_s)`` is the pure rule, client-go's
``leaderelection`` semantics:

- no Lease, no holder, or the holder's ``renewTime + leaseDurationSeconds`` has passed:
  take it (``holderIdentity = me``, ``acquireTime = renewTime = now``,
  ``leaseTransitions + 1`` when the holder changes);
- held by ``me``: renew (``renewTime = now``);
- held by another, unexpired: follow (no write).

``LeaseElector`` runs it every ``renew_s`` against the API with optimistic concurrency
(``resourceVersion``: a conflicting write is lost, not merged, so two replicas never both
lead); a leader that cannot renew within ``duration_s`` of its last renewal steps down
before another can take over, and one that stops gives the Lease up (``release``).
``on_change(leading)`` reports each transition. RBAC:
``leases`` get, create, update in the pool's namespace.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from typing import Any, Callable, Protocol

log = logging.getLogger("anchorage.router.lease")


def _fmt(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> float | None:
    if not s:
        return None
    s = s.rstrip("Z")
    for f in ("%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"):
        try:
            return dt.datetime.strptime(s, f).replace(tzinfo=dt.timezone.utc).timestamp()
        except ValueError:
            continue
    return None


def lease_step(spec: dict[str, Any] | None, me: str, now: float,
               duration_s: float) -> tuple[str, dict[str, Any] | None]:
    """("acquire" | "renew" | "follow", the spec to write or None)."""
    spec = dict(spec or {})
    holder = spec.get("holderIdentity") or ""
    renewed = _parse(spec.get("renewTime")) or 0.0
    held_for = spec.get("leaseDurationSeconds") or duration_s
    if holder == me:
        spec.update(renewTime=_fmt(now), leaseDurationSeconds=int(duration_s))
        return "renew", spec
    if holder and now < renewed + held_for:
        return "follow", None
    spec.update(holderIdentity=me, acquireTime=_fmt(now), renewTime=_fmt(now),
                leaseDurationSeconds=int(duration_s),
                leaseTransitions=int(spec.get("leaseTransitions") or 0) + (1 if holder else 0))
    return "acquire", spec


class LeaseAPI(Protocol):
    def get(self, namespace: str, name: str) -> dict | None: ...

    def create(self, namespace: str, name: str, spec: dict) -> None: ...

    def replace(self, namespace: str, name: str, resource_version: str, spec: dict) -> None: ...


class LeaseElector:
    def __init__(self, api: LeaseAPI, namespace: str, name: str, me: str,
                 duration_s: float = 15.0, renew_s: float = 2.0,
                 on_change: Callable[[bool], None] | None = None) -> None:
        self.api, self.namespace, self.name, self.me = api, namespace, name, me
        self.duration_s, self.renew_s = duration_s, renew_s
        self.on_change = on_change or (lambda leading: None)
        self.leading = False
        self._last_renew = 0.0
        self._stop = threading.Event()

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            self.on_change(leading)

    def step(self, now: float | None = None) -> bool:
        """One round; True when this replica leads afterwards."""
        now = time.time() if now is None else now
        try:
            obj = self.api.get(self.namespace, self.name)
            spec = (obj or {}).get("spec")
            action, new = lease_step(spec, self.me, now, self.duration_s)
            if action != "follow":
                if obj is None:
                    self.api.create(self.namespace, self.name, new)
                else:
                    self.api.replace(self.namespace, self.name,
                                     obj["metadata"]["resourceVersion"], new)
                self._last_renew = now
            self._set(action != "follow")
        except Exception as exc:  # noqa: BLE001 - a lost race or an unreachable API
            log.info("lease %s/%s not renewed (%s)", self.namespace, self.name, exc)
            if self.leading and now - self._last_renew >= self.duration_s - self.renew_s:
                self._set(False)    # step down before another replica may take over
        return self.leading

    def run(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(self.renew_s)
        self.release()

    def release(self) -> None:
        """Stopping while leading: give the Lease up (no holder), so another replica takes
        over at its next round instead of after the lease expires (client-go's
        ``ReleaseOnCancel``)."""
        if self.leading:
            try:
                obj = self.api.get(self.namespace, self.name)
                if obj and (obj.get("spec") or {}).get("holderIdentity") == self.me:
                    spec = {**obj["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                    self.api.replace(self.namespace, self.name,
                                     obj["metadata"]["resourceVersion"], spec)
            except Exception as exc:  # noqa: BLE001 - it expires by itself then
                log.info("lease %s/%s not released (%s)", self.namespace, self.name, exc)
        try:
            self._set(False)
        except RuntimeError:      # the process is shutting down (its event loop closed)
            pass

    def stop(self) -> None:
        self._stop.set()


class KubeLeaseAPI:
    """``LeaseAPI`` over the official ``kubernetes`` client."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        from anchorage.router.discovery import kube_api_client

        api_client = kube_api_client(api_client)
        self._api = client.CoordinationV1Api(api_client)
        self._exc = client.exceptions.ApiException

    def get(self, namespace: str, name: str) -> dict | None:
        try:
            res = self._api.read_namespaced_lease(name, namespace, _preload_content=False)
        except self._exc as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(res.data)

    def create(self, namespace: str, name: str, spec: dict) -> None:
        self._api.create_namespaced_lease(namespace, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec})

    def replace(self, namespace: str, name: str, resource_version: str, spec: dict) -> None:
        self._api.replace_namespaced_lease(name, namespace, {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace,
                         "resourceVersion": resource_version}, "spec": spec})
