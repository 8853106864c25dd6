"""Placement oracles for bounds: record a router's placement, replay it, and give each
replica's Belady the future of its own requests only.

Specification
-------------
Question answered: with a router's placement fixed, how close can *any* eviction policy
bring separate per-replica caches to one pooled cache of the same total size? The upper
reference for each side is Belady's MIN (``anchorage.policies.belady``), which needs the
future as each cache will see it:

- ``RecordingRouter(inner)``: routes like ``inner`` and records ``assignment[ctx.seq] =
  replica index`` for every decision (``seq`` is the request's position in the trace).
- ``ReplayRouter(assignment)``: sends request ``seq`` to ``assignment[seq]`` (a position
  in ``replicas``; the simulator's indexes are positions). An unknown ``seq`` is a
  ``KeyError`` naming it: a replay must cover the run it replays.
- ``replica_future_belady(contexts, block_size, assignment, replica)``: Belady for one
  replica whose future is only the requests routed to it: request ``t``'s hit cap is
  ``(input_length - 1) // block_size`` when ``assignment[t] == replica``, else 0 (a use
  on another replica is no use here). The trace-order ``belady`` on every replica would
  keep blocks whose next use happens on another replica, so it is not a bound for
  separate caches.

The bound is then ``replica_future_belady`` under ``ReplayRouter(recorded)`` vs
``belady`` on the pooled cache, with the same arrivals and hardware. Timing is
re-simulated (more hits, faster prefills); the placement is not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from anchorage.policies.base import RequestContext
from anchorage.policies.belady import BeladyPolicy
from anchorage.routing.base import ReplicaView, Router


class RecordingRouter(Router):
    """Routes like ``inner``; ``assignment`` maps each request's ``seq`` to its replica."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner
        self.name = f"recording({inner.name})"
        self.assignment: dict[int, int] = {}

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        p = self.inner.pick(ctx, replicas)
        self.assignment[ctx.seq] = replicas[p].index
        return p

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        self.inner.on_start(ctx, replica)

    def on_finish(self, ctx: RequestContext, replica: int) -> None:
        self.inner.on_finish(ctx, replica)

    def on_kv_event(self, replica: int, event) -> None:
        self.inner.on_kv_event(replica, event)

    @property
    def decisions(self):
        return getattr(self.inner, "decisions", None)


class ReplayRouter(Router):
    """Sends each request where ``assignment`` says (by ``ctx.seq``)."""

    name = "replay"

    def __init__(self, assignment: Mapping[int, int]) -> None:
        self.assignment = assignment

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        try:
            r = self.assignment[ctx.seq]
        except KeyError:
            raise KeyError(f"request seq {ctx.seq} has no recorded replica") from None
        return next(i for i, v in enumerate(replicas) if v.index == r)


def replica_future_belady(contexts: Sequence[RequestContext], block_size: int,
                          assignment: Mapping[int, int], replica: int) -> BeladyPolicy:
    """Belady for ``replica``: only the requests ``assignment`` sends there are uses."""
    limits = [max(0, (c.input_length - 1) // block_size)
              if assignment.get(c.seq) == replica else 0 for c in contexts]
    return BeladyPolicy([c.keys for c in contexts], limits,
                        [c.input_length for c in contexts])
