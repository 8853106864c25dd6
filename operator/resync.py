"""The periodic reconcile pass: every watched policy, every interval, and no finalizer.

Specification
-------------
Why not kopf's timer: kopf puts its finalizer on every object a timer or daemon serves, so
a policy deleted while no operator runs stays Terminating forever. ``helm uninstall`` does
exactly that: it deletes the operator's Deployment, ServiceAccount and RBAC before the
chart's own policies (custom kinds go last), and an exiting operator cannot take its
finalizers off with a deleted ServiceAccount's token. The operator's change handlers
(create, spec update, resume) need no finalizer, and nothing has to happen when a policy
goes (the ConfigMaps it wrote are garbage-collected through their ownerReference), so
this loop replaces the timer:

- ``Resync.run`` (a thread started by the operator): every ``interval_s`` seconds, the
  first one after ``interval_s``, while ``active()``: list the policies of the watched
  namespaces (all when none are named) and run ``pass_fn(body)`` on each one not being
  deleted, then patch the returned status onto the ``status`` subresource (keys merged,
  as kopf's patch does) and post the returned Events (``core/v1`` Events on the policy,
  component ``anchorage-operator``). A policy deleted meanwhile (404) is skipped; any other
  failure of one policy's pass is logged and counted by ``pass_fn``'s caller and the loop
  goes on; a failed list is logged and retried at the next interval.
- ``active(peering, read)``: kopf's own peering rule, so that only the replica kopf keeps
  active resyncs. Standalone: always. Otherwise every peering object the operator uses
  (``ClusterKopfPeering`` ``name`` when cluster-wide, else a ``KopfPeering`` ``name`` in each
  watched namespace) must list no *other* live peer (``lastseen + lifetime`` in the future)
  with a priority at least this replica's (kopf pauses every replica that shares the top
  priority). An absent peering object: inactive when peering is mandatory (``--peering
  NAME``, which ``anchorage operator`` always passes), active otherwise. An unreadable
  one: inactive for this round (logged). This replica's own entry is the one named
  ``identity`` (kopf's identity: ``$POD_ID``, which ``anchorage operator`` sets when
  absent); with no identity, one entry of its own priority is taken to be its own.
- The pass of one policy never runs twice at once: ``lock_for(uid)`` is shared with the
  change handlers (kopf serialised its timer with them per object); each round drops the
  idle locks of policies no longer listed.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("anchorage.operator.resync")

GROUP, VERSION, PLURAL = "anchorage.dev", "v1alpha1", "agentcachepolicies"
KIND = "AgentCachePolicy"
COMPONENT = "anchorage-operator"

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def lock_for(uid: str) -> threading.Lock:
    """The lock of one policy's reconcile pass (periodic or on change)."""
    with _locks_guard:
        return _locks.setdefault(uid, threading.Lock())


def prune_locks(keep: set[str]) -> None:
    """Drop the idle locks of policies not in ``keep`` (deleted ones)."""
    with _locks_guard:
        for uid in [u for u, lk in _locks.items() if u not in keep and not lk.locked()]:
            del _locks[uid]


@dataclass(frozen=True, kw_only=True)
class Peering:
    """What ``active`` needs of kopf's peering settings."""
    name: str
    standalone: bool
    mandatory: bool
    clusterwide: bool
    priority: int
    identity: str | None = None


def _live(info: Mapping[str, Any], now: dt.datetime) -> bool:
    seen = info.get("lastseen")
    if seen is None:
        return True
    try:
        last = dt.datetime.fromisoformat(str(seen).replace("Z", "+00:00"))
    except ValueError:
        return False
    if last.tzinfo is None:
        last = last.replace(tzinfo=dt.UTC)
    return last + dt.timedelta(seconds=float(info.get("lifetime", 60))) > now


def active(peering: Peering, read: Callable[[str | None], Mapping[str, Any] | None],
           namespaces: tuple[str, ...], now: dt.datetime | None = None) -> bool:
    """kopf's peering rule (see the module docstring). ``read(namespace)`` returns the
    peering object (``None``: cluster-wide) or None when it does not exist; it may raise."""
    if peering.standalone:
        return True
    now = now or dt.datetime.now(dt.UTC)
    for ns in ((None,) if peering.clusterwide or not namespaces else namespaces):
        try:
            obj = read(ns)
        except Exception as e:  # noqa: BLE001
            log.warning("resync paused: the peering object %r is unreadable: %s",
                        peering.name, e)
            return False
        if obj is None:
            if peering.mandatory:
                return False
            continue
        peers = {k: v for k, v in (obj.get("status") or {}).items()
                 if isinstance(v, Mapping) and _live(v, now)}
        if peering.identity is not None:
            peers.pop(peering.identity, None)
        prios = sorted((int(v.get("priority", 0)) for v in peers.values()), reverse=True)
        if peering.identity is None and peering.priority in prios:
            prios.remove(peering.priority)      # one entry of its own priority is its own
        if prios and prios[0] >= peering.priority:
            return False
    return True


class Resync:
    """The loop (see the module docstring). ``pass_fn(body) -> (status, events)``, the
    events with ``type``, ``reason`` and ``message`` (``reconcile.Event``)."""

    def __init__(self, api: client.ApiClient, pass_fn: Callable[[dict], tuple[dict, list]],
                 *, interval_s: float, namespaces: tuple[str, ...], peering: Peering):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.co = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.pass_fn = pass_fn
        self.interval_s = float(interval_s)
        self.namespaces = namespaces
        self.peering = peering
        self.stopped = threading.Event()
        self.passes = 0
        self._thread: threading.Thread | None = None

    # -- the API reads and writes -------------------------------------------------------
    def _read_peering(self, ns: str | None) -> Mapping[str, Any] | None:
        try:
            if ns is None:
                return self.co.get_cluster_custom_object(
                    "kopf.dev", "v1", "clusterkopfpeerings", self.peering.name)
            return self.co.get_namespaced_custom_object(
                "kopf.dev", "v1", ns, "kopfpeerings", self.peering.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _policies(self) -> list[dict]:
        if self.namespaces:
            return [o for ns in self.namespaces for o in self.co.list_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL)["items"]]
        return self.co.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]

    def _post(self, body: Mapping[str, Any], ev: Any) -> None:
        meta = body["metadata"]
        now = dt.datetime.now(dt.UTC)
        self.core.create_namespaced_event(meta["namespace"], {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "type": ev.type, "reason": ev.reason, "message": ev.message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": self.peering.identity or COMPONENT,
            "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(), "count": 1})

    # -- one round and the loop ---------------------------------------------------------
    def round(self) -> int:
        """One pass over every policy when active; returns how many passes ran."""
        if not active(self.peering, self._read_peering, self.namespaces):
            return 0
        ran = 0
        policies = self._policies()
        prune_locks({p["metadata"]["uid"] for p in policies})
        for body in policies:
            meta = body["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            try:
                status, events = self.pass_fn(body)
            except Exception:  # noqa: BLE001  (counted by pass_fn's caller)
                log.exception("periodic reconcile of %s/%s failed", meta["namespace"],
                              meta["name"])
                continue
            try:
                if status:
                    self.co.patch_namespaced_custom_object_status(
                        GROUP, VERSION, meta["namespace"], PLURAL, meta["name"],
                        {"status": status})
                for ev in events:
                    self._post(body, ev)
            except ApiException as e:
                if e.status != 404:
                    log.warning("periodic reconcile of %s/%s: writing its status failed: %s",
                                meta["namespace"], meta["name"], e)
                continue
            ran += 1
        self.passes += ran
        return ran

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.round()
            except Exception as e:  # noqa: BLE001
                log.warning("periodic reconcile: listing the policies failed: %s", e)

    def start(self) -> Resync:
        self._thread = threading.Thread(target=self.run, name="anchorage-resync", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
