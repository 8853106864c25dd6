"""``session_affinity``: the vLLM production-stack router's ``session`` routing logic.

Spec (vllm-project/production-stack ``src/vllm_router/routers/routing_logic.py``,
``SessionRouter``): a request carrying a session id goes to the owner of the id on a
consistent-hash ring of the healthy replicas (``uhashring.HashRing``; here ``vnodes``
points per replica, ``H(name#i)``, the first point clockwise from ``H(session)``), with
no load bound: a session stays on its replica however loaded it is. A request without a
session id goes to the replica with the lowest request rate (``_qps_routing``: requests
routed there in the last ``qps_window_s`` seconds of the policy clock; ties: the lower
index).

Parameters: ``vnodes`` (160, uhashring's default), ``qps_window_s`` (60).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.keys import stable_hash


class SessionAffinityRouter(Router):
    name = "session_affinity"

    def __init__(self, vnodes: int = 160, qps_window_s: float = 60.0) -> None:
        if vnodes < 1 or qps_window_s <= 0:
            raise ValueError("vnodes must be >= 1 and qps_window_s > 0")
        self.vnodes = vnodes
        self.qps_window_s = qps_window_s
        self._ring: list[int] = []
        self._owner: list[int] = []
        self._members: tuple = ()
        self._recent: dict[int, deque] = {}

    def _rebuild(self, replicas: Sequence[ReplicaView], pos: Sequence[int]) -> None:
        pts = sorted((stable_hash(f"{replicas[p].name or replicas[p].index}#{i}"), p)
                     for p in pos for i in range(self.vnodes))
        self._ring = [h for h, _ in pts]
        self._owner = [p for _, p in pts]

    def _qps(self, replica: int, now: float) -> int:
        q = self._recent.get(replica)
        if not q:
            return 0
        while q and q[0] < now - self.qps_window_s:
            q.popleft()
        return len(q)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        if ctx.session_id is None:
            return min(pos, key=lambda p: (self._qps(replicas[p].index, ctx.now_s), p))
        members = tuple((replicas[p].index, replicas[p].name) for p in pos)
        if members != self._members:
            self._members = members
            self._rebuild(replicas, pos)
        i = bisect.bisect(self._ring, stable_hash(f"{ctx.tenant}:{ctx.session_id}"))
        return self._owner[i % len(self._owner)]

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        self._recent.setdefault(replica, deque()).append(ctx.now_s)


ROUTERS = {"session_affinity": lambda **params: SessionAffinityRouter(**params)}
