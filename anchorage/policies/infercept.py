"""`infercept`: evict by a session-local moving average of observed gaps (InferCept,
Abhyankar et al., ICML'24, as the CacheWise paper describes its eviction baseline).

Specification
-------------
Inputs: each request's ``session_id`` and the policy clock ``now_s``. Tool-agnostic: it
never reads ``tool_name``/``tool_args`` (nor ``tool_duration_ms``). Parameters:
``alpha`` = 0.5 (weight of the newest gap in the moving average), ``default_gap_s`` = 1.0
(prediction before any gap was observed anywhere), ``stale_factor`` = 3.0, ``max_sessions``
= 65536 (session table, LRU-capped).

- A session's gap is learned only when its next request arrives: ``g = now - end`` where
  ``end`` is when its previous request finished (released its blocks);
  ``avg_s <- g`` for the first gap, then ``avg_s <- alpha * g + (1 - alpha) * avg_s``. A
  global average over all sessions' gaps (same rule) is the prior for a session without
  history.
- Blocks released at time ``t`` by a request of session ``s`` get a predicted next use
  ``t + avg_s``; blocks of requests without a session never come back (``+inf``).
- Victim: the evictable block whose predicted next use is furthest (ties: released
  earliest, a chain's tail first, so with no sessions the order is LRU's).
- Adaptation (a session that never returns would otherwise be protected forever): a
  block is *stale* once ``now > t + stale_factor * avg_s`` (its prediction was falsified);
  stale blocks are evicted first, the earliest-falsified first.

Cost: O(1) per block (hit, release, victim) plus O(log r) per release, ``r`` the number
of distinct live predictions (bucket queues: one release shares its prediction); state
bounded by ``max_sessions``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Iterable

from anchorage.policies._lazyheap import BucketQueue
from anchorage.policies.base import EvictionPolicy, RequestContext


def ema(avg: float | None, x: float, alpha: float) -> float:
    return x if avg is None else alpha * x + (1.0 - alpha) * avg


class InferCeptPolicy(EvictionPolicy):
    name = "infercept"

    def __init__(self, alpha: float = 0.5, default_gap_s: float = 1.0,
                 stale_factor: float = 3.0, max_sessions: int = 65536) -> None:
        if not 0 < alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha, self.default_gap_s = alpha, default_gap_s
        self.stale_factor, self.max_sessions = stale_factor, max_sessions
        self._now = 0.0
        # session -> [end of its latest request (or None while one runs), avg gap or None]
        self._sessions: OrderedDict[str, list] = OrderedDict()
        self.global_gap_s: float | None = None
        # evictable blocks by -predicted next use, and by the time their prediction fails;
        # one release shares both priorities, so buckets make it O(1) per block
        self._by_next = BucketQueue()
        self._by_stale = BucketQueue()

    def predicted_gap_s(self, session_id: str | None) -> float:
        if session_id is None:
            return math.inf
        st = self._sessions.get(session_id)
        if st is not None and st[1] is not None:
            return st[1]
        return self.global_gap_s if self.global_gap_s is not None else self.default_gap_s

    def on_request(self, ctx: RequestContext) -> None:
        now = ctx.now_s
        if now > self._now:
            self._now = now
        sid = ctx.session_id
        if sid is None:
            return
        sess = self._sessions
        st = sess.get(sid)
        if st is None:
            sess[sid] = [None, None]
            if len(sess) > self.max_sessions:
                sess.popitem(last=False)
            return
        sess.move_to_end(sid)
        if st[0] is not None:
            gap = max(0.0, now - st[0])
            st[1] = ema(st[1], gap, self.alpha)
            self.global_gap_s = ema(self.global_gap_s, gap, self.alpha)
            st[0] = None

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        for b in were_free:
            self._by_next.remove(b)
            self._by_stale.remove(b)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        t = max(self._now, ctx.now_s)
        gap = self.predicted_gap_s(ctx.session_id)
        self._by_next.push_many(blocks, -(t + gap))
        if gap != math.inf:
            self._by_stale.push_many(blocks, t + self.stale_factor * gap)

    def on_request_done(self, ctx: RequestContext) -> None:
        t = max(self._now, ctx.now_s)
        self._now = t
        sid = ctx.session_id
        if sid is not None:
            st = self._sessions.get(sid)
            if st is None:
                st = self._sessions[sid] = [None, None]
                if len(self._sessions) > self.max_sessions:
                    self._sessions.popitem(last=False)
            st[0] = t

    def pop_victim(self) -> int | None:
        stale = self._by_stale.peek_priority()
        if stale is not None and stale < self._now:
            b = self._by_stale.pop()
            self._by_next.remove(b)
            return b
        b = self._by_next.pop()
        if b is not None:
            self._by_stale.remove(b)
        return b

    def eviction_order(self) -> Iterable[int]:
        now, q = self._now, self._by_stale
        stale = [b for b in q.ordered() if q.priority(b) < now]
        gone = set(stale)
        return stale + [b for b in self._by_next.ordered() if b not in gone]

    def reset(self) -> None:
        self._by_next.clear()
        self._by_stale.clear()

    def state_size_bytes(self) -> int:
        return 120 * len(self._sessions) + 64


POLICIES = {"infercept": lambda block_size=16, **params: InferCeptPolicy(**params)}
