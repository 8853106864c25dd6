"""The routing protocol shared by the cluster simulator and the Ray Serve router.

A router picks a replica for each request from plain data: the request's context (its
block keys, session, tenant, tool metadata) and a view of each replica's state. It is
told when a request starts and finishes on a replica so it can keep its own model of
what each replica caches. Implementations live one per module in this package and are
pure: no Ray, no HTTP.

Conventions every router follows:

- ``pick(ctx, replicas)`` returns a *position* in ``replicas``; it never mutates
  ``replicas``. Callers then call ``on_start(ctx, replicas[i].index)`` when the request is
  sent there and ``on_finish(ctx, replica_index)`` when it completes. Per-replica state
  is keyed by ``ReplicaView.index``, a stable identifier (the simulator uses positions;
  the Ray app assigns a stable id to each upstream), so replicas may join, leave or be
  ejected between calls.
- ``on_first_token(ctx, replica_index)``: the request's prefill completed there (its first
  token came back); routers that count prefill work in flight (``dynamo_kv``) use it.
- ``on_kv_event(replica_index, event)`` feeds a replica's real KV cache events
  (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared`` from ``anchorage.routing.events``);
  routers that do not use them ignore them.
- ``on_peer_start(ctx, replica_index)``: another router process sent ``ctx`` there (the
  Ray app shares decisions between its router replicas); the default treats it as
  ``on_start``, routers whose ``pick`` also records state (sessions, placements) follow
  the peer's decision.
- ``predicted_hit_blocks(ctx, replica_index)`` is the router's own estimate of how many
  leading blocks of ``ctx`` are cached there (0 for routers without a cache model); the
  Ray app exports it next to the observed ``cached_tokens``.
- Raising ``NoReplicaError`` means no replica is eligible (none healthy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from anchorage.policies.base import RequestContext


class NoReplicaError(RuntimeError):
    """No healthy replica to route to."""


@dataclass(slots=True)
class ReplicaView:
    """What a router may know about one replica at decision time.

    ``queued_tokens`` is the prefill work queued on the replica, in tokens: the prompts
    of its waiting requests plus the prefill its running requests still have to compute
    (the simulator knows it exactly; the Ray app estimates it from the prompts it sent
    that have not produced a first token yet). ``load_score`` (``anchorage.routing.load``)
    folds it into one comparable number with the request counts and KV usage.

    ``extra`` carries optional replica policy state, e.g. ``{"anchors": [agent ids the
    replica's eviction policy protects or is prefetching]}`` (read by the ``agent``
    router) or ``{"max_load": 32}`` (saturation bound).

    ``host_tier``: the replica's engine copies its KV to host memory (vLLM's offloading
    connector, LMCache's CPU backend), so a history evicted from its GPU is reloaded there,
    not recomputed: what it held stays its own (the simulator knows it from the tiering
    mode; the Ray app from the engine's ``vllm:kv_offload_*`` / ``lmcache:`` series).

    ``prefill_tokens_per_s``: the replica's prefill rate, from its cost model (the simulator
    derives it from the hardware profile; the Ray app from the engine's prefill time and
    prompt token counters); 0 when not known, which prices it as its known peers, or in
    tokens when no replica's rate is known (a homogeneous fleet)."""

    index: int
    name: str = ""
    healthy: bool = True
    running: int = 0            # requests running
    waiting: int = 0            # requests queued
    kv_usage: float = 0.0       # 0..1 fraction of KV blocks in use
    queued_tokens: int = 0      # prefill tokens waiting or still to compute
    capacity_blocks: int = 0
    host_tier: bool = False     # keeps copies of its KV in host memory (an offloading tier)
    prefill_tokens_per_s: float = 0.0   # measured prefill rate (0: unknown; same as the others)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def load(self) -> int:
        return self.running + self.waiting


class Router:
    """Base class. ``pick`` must return the position in ``replicas`` of a healthy
    replica; the others are notifications with default no-ops."""

    name = "base"

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        raise NotImplementedError

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_finish(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_first_token(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_peer_start(self, ctx: RequestContext, replica: int) -> None:
        self.on_start(ctx, replica)

    def on_kv_event(self, replica: int, event: Any) -> None:
        pass

    def on_replica_removed(self, replica: int) -> None:
        """The replica left the fleet (scaled in, or its cache was lost): forget it."""

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        return 0


def healthy_positions(replicas: Sequence[ReplicaView]) -> list[int]:
    out = [i for i, r in enumerate(replicas) if r.healthy]
    if not out:
        raise NoReplicaError("no healthy replica")
    return out


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
        raise NoReplicaError("no healthy replica")
