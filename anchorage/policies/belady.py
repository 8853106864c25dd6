"""`belady`: the offline optimum (Belady's MIN), the reference every benchmark reports.

Specification
-------------
Evict the evictable block whose content is next used furthest in the future (never used
again = infinitely far). "Used" means: a later request can hit the block's key, i.e. the
key appears at a chain position below that request's hit cap
``(input_length - 1) // block_size``, and the request can run at all (its prompt fits in
the pool; a request that never runs is never a use).

The next use is a property of the key, kept exact at all times: when request ``t``
arrives, every key of its prompt gets ``next_use = table[t][i]`` (the first later request
that can hit it), whether ``t`` hits it or not, so no block carries a stale next use
after its key was used (or recomputed) by a request that missed it. Two refinements
follow from vLLM's prefix-cache mechanics:

- A duplicate physical block (same key cached twice, vLLM does not de-duplicate) is never
  hit while the first copy is cached (lookups take the first one): it is worth nothing
  (next use = infinity) until the first copy is evicted, then it inherits the key's next
  use.
- Ties go to the deeper block of a chain first (a block is only useful while every block
  before it is cached; a parent's next use is never later than its child's), then to the
  block freed first.

It reads the future, so it exists only in the simulator: it is built from the whole
replay (keys, hit caps and prompt lengths of every request, indexed by
``RequestContext.seq``) and learns the pool's size when attached to it.

Cost: one backward pass over the trace to precompute next uses; O(log n) per victim (a
heap with lazy invalidation); O(1) per hit, cached and freed block; O(k log n) per request
of k blocks (re-prioritising its keys' evictable blocks).
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, Sequence

from anchorage.policies._lazyheap import LazyHeap
from anchorage.policies.base import EvictionPolicy, RequestContext

INF = math.inf


def next_use_table(keys_per_request: Sequence[Sequence[Hashable]],
                   hit_limits: Sequence[int]) -> list[list[float]]:
    """``table[t][i]`` = index of the next request after ``t`` that can hit the key at
    position ``i`` of request ``t`` (INF if none). Request ``u`` can hit the keys at its
    positions ``< hit_limits[u]``."""
    nxt: dict[Hashable, int] = {}
    table: list[list[float]] = [[]] * len(keys_per_request)
    for t in range(len(keys_per_request) - 1, -1, -1):
        keys = keys_per_request[t]
        get = nxt.get
        table[t] = [get(k, INF) for k in keys]
        for i in range(min(hit_limits[t], len(keys))):
            nxt[keys[i]] = t
    return table


class BeladyPolicy(EvictionPolicy):
    name = "belady"
    offline = True

    def __init__(self, keys_per_request: Sequence[Sequence[Hashable]],
                 hit_limits: Sequence[int], input_lengths: Sequence[int] | None = None):
        self._keys = keys_per_request
        self._limits = list(hit_limits)
        self._inputs = input_lengths
        self._next = next_use_table(keys_per_request, self._limits)
        self._key_next: dict[Hashable, float] = {}  # key -> its next use after now
        self._depth: dict[int, int] = {}  # cached block -> chain position
        self._heap = LazyHeap()  # evictable blocks, first victim on top

    def attach(self, pool) -> None:
        super().attach(pool)
        if self._inputs is not None:  # a request whose prompt cannot fit never runs
            cap = pool.capacity_blocks
            limits = [0 if pool.blocks_needed(n) > cap else lim
                      for n, lim in zip(self._inputs, self._limits)]
            if limits != self._limits:
                self._limits = limits
                self._next = next_use_table(self._keys, limits)

    # -- priorities -----------------------------------------------------------------------

    def _priority(self, b: int) -> tuple:
        pool = self.pool
        key = pool.block_key[b]
        if key is None or pool.get_cached_block(key) != b:
            nu = INF  # not cached or a duplicate copy: never hit
        else:
            nu = self._key_next.get(key, INF)
        return (-nu, -self._depth.get(b, 0))

    def _reprioritise(self, key: Hashable) -> None:
        b = self.pool.get_cached_block(key)
        if b is not None and b in self._heap:
            self._heap.push(b, self._priority(b))

    # -- notifications --------------------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        if ctx.seq < 0:
            return
        row = self._next[ctx.seq]
        key_next = self._key_next
        for k, nu in zip(ctx.keys, row):
            if key_next.get(k, INF) != nu:
                key_next[k] = nu
                self._reprioritise(k)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        heap = self._heap
        for b in were_free:
            heap.remove(b)

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        depth = self._depth
        for j, b in enumerate(blocks):
            depth[b] = start + j

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        heap = self._heap
        for b in blocks:
            heap.push(b, self._priority(b))

    def pop_victim(self) -> int | None:
        return self._heap.pop()

    def on_evicted(self, block: int, key: Hashable) -> None:
        self._depth.pop(block, None)
        # a duplicate copy of the key, if any, is now the one lookups find
        self._reprioritise(key)

    def eviction_order(self) -> Iterable[int]:
        return list(self._heap.ordered())

    def reset(self) -> None:
        self._heap.clear()
        self._depth.clear()
