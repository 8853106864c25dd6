"""`ttl`: Continuum's KV-cache time-to-live (Li et al., arXiv:2511.02230), then LRU.

Specification
-------------
Inputs: each request's ``session_id`` and the policy clock ``now_s``. Parameters:
``ttl_s`` = 0.3 (seconds a session's blocks stay pinned after each of its turns; the value
the CacheScout paper uses for Continuum, from AutoGen's observed inter-turn latency, sec. 5),
``require_tool`` = False (pin only after a turn that ended with a tool call, i.e. has a
``tool_name``, as Continuum does around tool-call boundaries).

When a request of a session finishes at time ``t``, the blocks it frees are pinned until
``t + ttl_s``. Victim order:

1. unpinned blocks (no session, or pin expired) in LRU order: the block freed earliest
   first (a chain's tail first within one release, as vLLM frees);
2. only when every evictable block is still pinned: the pin that expires first.

A hit unpins (the block is in use again); the next release pins it anew. Because ``ttl_s``
is the same for every block, expiry order equals release order, so pinned blocks are one
FIFO and an expired pin joins the LRU by its release time (a merge of two queue heads).

Cost: O(1) per touch and per victim (two ordered dicts).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from anchorage.policies.base import EvictionPolicy, RequestContext


class TTLPolicy(EvictionPolicy):
    name = "ttl"

    def __init__(self, ttl_s: float = 0.3, require_tool: bool = False) -> None:
        if ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        self.ttl_s, self.require_tool = float(ttl_s), require_tool
        self._now = 0.0
        self._lru: OrderedDict[int, float] = OrderedDict()     # unpinned: block -> freed at
        self._pinned: OrderedDict[int, float] = OrderedDict()  # pinned: block -> freed at

    def on_request(self, ctx: RequestContext) -> None:
        if ctx.now_s > self._now:
            self._now = ctx.now_s

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        lru, pinned = self._lru, self._pinned
        for b in were_free:
            if lru.pop(b, None) is None:
                pinned.pop(b, None)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        now = max(self._now, ctx.now_s)
        self._now = now
        pin = ctx.session_id is not None and (not self.require_tool or ctx.tool_name)
        q = self._pinned if pin and self.ttl_s > 0 else self._lru
        for b in blocks:
            q[b] = now

    def pop_victim(self) -> int | None:
        lru, pinned = self._lru, self._pinned
        if pinned:
            b, t = next(iter(pinned.items()))
            expired = t + self.ttl_s <= self._now
            if expired and (not lru or t < next(iter(lru.values()))):
                del pinned[b]
                return b
            if not lru:
                return pinned.popitem(last=False)[0]
        if lru:
            return lru.popitem(last=False)[0]
        return None

    def eviction_order(self) -> Iterable[int]:
        now, ttl = self._now, self.ttl_s
        expired = [(t, i, b) for i, (b, t) in enumerate(self._pinned.items()) if t + ttl <= now]
        live = [b for b, t in self._pinned.items() if t + ttl > now]
        unpinned = [(t, -1, i, b) for i, (b, t) in enumerate(self._lru.items())]
        merged = sorted(unpinned + [(t, 0, i, b) for t, i, b in expired])
        return [e[-1] for e in merged] + live

    def reset(self) -> None:
        self._lru.clear()
        self._pinned.clear()


POLICIES = {"ttl": lambda block_size=16, **params: TTLPolicy(**params)}
