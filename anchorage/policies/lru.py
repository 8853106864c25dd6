"""`lru`: vLLM's own eviction order, exactly.

Specification
-------------
vLLM v1 appends a request's cached blocks to the tail of the free queue when their
reference count reaches zero, in reverse chain order (a chain's tail before its head), and
allocates from the head. A hit removes a block from the queue. So among cached free
blocks the victim is the one that became free earliest; within one release, the deepest
block of the chain goes first. No parameters.

Cost: O(1) per notification and per victim (an OrderedDict is the queue); the pool may
take several victims in one call (``pop_victims``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from anchorage.policies.base import EvictionPolicy, RequestContext


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict()

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        q = self._queue
        for b in were_free:
            q.pop(b, None)  # a block it never saw freed: nothing to forget

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        q = self._queue
        for b in blocks:
            q[b] = None

    def pop_victim(self) -> int | None:
        q = self._queue
        if not q:
            return None
        return q.popitem(last=False)[0]

    def pop_victims(self, n: int) -> list[int]:
        """The next ``n`` victims at once (fewer if the queue runs out): the pool's fast
        path, valid because this order never depends on eviction notifications."""
        q = self._queue
        popitem = q.popitem
        return [popitem(False)[0] for _ in range(min(n, len(q)))]

    def eviction_order(self) -> Iterable[int]:
        return list(self._queue)

    def reset(self) -> None:
        self._queue.clear()
