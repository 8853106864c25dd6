"""``session``: consistent hashing with bounded load.

Spec (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA
2018): each replica owns ``vnodes`` points on a 64-bit ring (``H(name#i)``). A request's
key ``k`` is its session id (else its tenant and first block key, so session-less requests
of one conversation still agree). Walk the ring clockwise from ``H(k)``; take the first
healthy replica whose load is below the bound

    bound = ceil(c * (total_load + 1) / n_healthy)

where load is ``running + waiting``. With ``c = 1.25`` no replica exceeds 125 % of the mean
while a session moves only when its replica is over the bound or leaves the ring.

Parameters: ``c`` (1.25), ``vnodes`` (64 points per replica).
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import NoReplicaError, ReplicaView, Router, healthy_positions
from anchorage.routing.keys import stable_hash


def session_key(ctx: RequestContext) -> str:
    if ctx.session_id is not None:
        return f"s:{ctx.tenant}:{ctx.session_id}"
    first = ctx.keys[0] if ctx.keys else ctx.request_id
    return f"k:{ctx.tenant}:{first}"


class SessionRouter(Router):
    name = "session"

    def __init__(self, c: float = 1.25, vnodes: int = 64) -> None:
        if c < 1.0:
            raise ValueError("c must be >= 1")
        self.c = c
        self.vnodes = vnodes
        self._ring: list[int] = []
        self._owner: list[int] = []          # ReplicaView.index per ring point
        self._members: frozenset = frozenset()

    def _rebuild(self, replicas: Sequence[ReplicaView]) -> None:
        points = []
        for r in replicas:
            ident = r.name or str(r.index)
            for i in range(self.vnodes):
                points.append((stable_hash(f"{ident}#{i}"), r.index))
        points.sort()
        self._ring = [p for p, _ in points]
        self._owner = [o for _, o in points]
        self._members = frozenset((r.index, r.name) for r in replicas)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        members = frozenset((r.index, r.name) for r in replicas)
        if members != self._members:
            self._rebuild(replicas)
        healthy = healthy_positions(replicas)
        by_index = {replicas[p].index: p for p in healthy}
        total = sum(replicas[p].load for p in healthy)
        bound = math.ceil(self.c * (total + 1) / len(healthy))
        start = bisect.bisect(self._ring, stable_hash(session_key(ctx)))
        n = len(self._ring)
        seen: set[int] = set()
        for j in range(n):
            idx = self._owner[(start + j) % n]
            if idx in seen:
                continue
            seen.add(idx)
            p = by_index.get(idx)
            if p is not None and replicas[p].load < bound:
                return p
            if len(seen) == len(self._members):
                break
        raise NoReplicaError("no healthy replica")  # unreachable: bound > min load


ROUTERS = {"session": lambda **params: SessionRouter(**params)}
