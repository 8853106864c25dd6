"""The routing protocol shared by the cluster simulator and the Ray Serve router.

A router picks a replica for each request from plain data: the request's context (its
block keys, session, tenant, tool metadata) and a view of each replica's state. It is
told when a request starts and finishes on a replica so it can keep its own model of
what each replica caches. Implementations live one per module in this package and are
pure: no Ray, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from anchorage.policies.base import RequestContext


@dataclass(slots=True)
class ReplicaView:
    """What a router may know about one replica at decision time."""

    index: int
    name: str = ""
    healthy: bool = True
    running: int = 0            # requests running
    waiting: int = 0            # requests queued
    kv_usage: float = 0.0       # 0..1 fraction of KV blocks in use
    capacity_blocks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return self.running + self.waiting


class Router:
    """Base class. ``pick`` must return the index (position in ``replicas``) of a healthy
    replica; the others are notifications with default no-ops."""

    name = "base"

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_finish(self, ctx: RequestContext, replica: int) -> None:
        pass


class RoundRobinRouter(Router):
    """Cycle through healthy replicas in order."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        n = len(replicas)
        for _ in range(n):
            i = self._next % n
            self._next += 1
            if replicas[i].healthy:
                return i
        raise RuntimeError("no healthy replica")
