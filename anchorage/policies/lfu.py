"""`lfu`: least frequently used with dynamic aging (LFU-DA; Arlitt et al., 2000).

Specification
-------------
Inputs: hits and cachings of blocks. Parameters: none.

Each cached block ``b`` has a use count ``f_b`` (1 when cached, +1 per request that hits
it) and a priority ``K_b = L + f_b`` set at its latest use, where ``L`` is the cache's
age: the priority of the most recently evicted block (0 at start). The victim is the
evictable block with the smallest ``K_b``; ties go to the block that became free first
(and, within one release, to a chain's tail first, as vLLM frees). Evicting sets
``L <- K_victim``, so old high counts stop protecting a block forever: a block that is
not used again is overtaken once ``L`` has grown past its priority (aging).

Cost: O(1) per block plus O(log k) per new distinct priority (``k`` live distinct values
of ``K``: few, since ``K`` is an integer count above the current age), O(1) per hit;
state is per cached block only (count and priority), dropped on eviction.
"""

from __future__ import annotations

from typing import Iterable

from anchorage.policies._lazyheap import BucketQueue
from anchorage.policies.base import EvictionPolicy, RequestContext


class LFUPolicy(EvictionPolicy):
    name = "lfu"

    def __init__(self) -> None:
        self.age = 0.0                     # L
        self._freq: dict[int, int] = {}    # cached block -> use count
        self._prio: dict[int, float] = {}  # cached block -> K at its latest use
        self._heap = BucketQueue()         # evictable blocks by K (FIFO among equals)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        heap = self._heap
        for b in were_free:
            heap.remove(b)
        freq, prio, age = self._freq, self._prio, self.age
        for b in blocks:
            f = freq.get(b, 0) + 1
            freq[b] = f
            prio[b] = age + f

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys, start: int) -> None:
        freq, prio, age = self._freq, self._prio, self.age
        for b in blocks:
            freq[b] = 1
            prio[b] = age + 1

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        heap, prio, age = self._heap, self._prio, self.age
        for b in blocks:
            heap.push(b, prio.get(b, age + 1))

    def pop_victim(self) -> int | None:
        k = self._heap.peek_priority()
        if k is None:
            return None
        self.age = max(self.age, k)
        return self._heap.pop()

    def on_evicted(self, block: int, key) -> None:
        self._freq.pop(block, None)
        self._prio.pop(block, None)

    def eviction_order(self) -> Iterable[int]:
        return list(self._heap.ordered())

    def reset(self) -> None:
        for b in list(self._heap.ordered()):
            self._freq.pop(b, None)
            self._prio.pop(b, None)
        self._heap.clear()


POLICIES = {"lfu": lambda block_size=16, **params: LFUPolicy(**params)}
