"""`belady`: the offline optimum (Belady's MIN), the reference every benchmark reports.

Specification
-------------
Evict the evictable block whose key is next used furthest in the future (never used
again = infinitely far). Ties go to the deeper block of a chain first, since a block is
only useful while every block before it is cached. "Used" means: a later request can hit
it, i.e. the key appears at a chain position below that request's hit cap
``(input_length - 1) // block_size``.

It reads the future, so it exists only in the simulator: it is built from the whole
replay (the list of request contexts, indexed by ``RequestContext.seq``).

Cost: one backward pass over the trace to precompute next-use per (request, position);
O(log n) per victim (a heap with lazy invalidation); O(1) per hit, cached and freed block.
"""

from __future__ import annotations

import heapq
import math
from typing import Hashable, Iterable, Sequence

from anchorage.policies.base import EvictionPolicy, RequestContext

INF = math.inf


def next_use_table(keys_per_request: Sequence[Sequence[Hashable]],
                   hit_limits: Sequence[int]) -> list[list[float]]:
    """``table[t][i]`` = index of the next request after ``t`` that can hit the key at
    position ``i`` of request ``t`` (INF if none)."""
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
                 hit_limits: Sequence[int]):
        self._next = next_use_table(keys_per_request, hit_limits)
        self._block_next: dict[int, tuple[float, int]] = {}  # block -> (next use, depth)
        self._heap: list[tuple[float, int, int, int]] = []
        self._token: dict[int, int] = {}  # evictable block -> token of its live entry
        self._counter = 0

    def _note(self, ctx: RequestContext, blocks: list[int], start: int) -> None:
        row = self._next[ctx.seq] if ctx.seq >= 0 else None
        bn = self._block_next
        for j, b in enumerate(blocks):
            i = start + j
            nu = row[i] if row is not None and i < len(row) else INF
            bn[b] = (nu, i)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        tok = self._token
        for b in were_free:
            del tok[b]
        self._note(ctx, blocks, 0)

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        if ctx.seq >= 0 and start + len(blocks) <= len(ctx.keys) and keys and keys[0] == ctx.keys[start]:
            self._note(ctx, blocks, start)
        else:  # generated-token blocks: never named by a trace, never used again
            bn = self._block_next
            for j, b in enumerate(blocks):
                bn[b] = (INF, start + j)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        heap, tok, bn = self._heap, self._token, self._block_next
        for b in blocks:
            nu, depth = bn.get(b, (INF, 0))
            self._counter += 1
            tok[b] = self._counter
            heapq.heappush(heap, (-nu, -depth, self._counter, b))

    def pop_victim(self) -> int | None:
        heap, tok = self._heap, self._token
        while heap:
            _, _, c, b = heapq.heappop(heap)
            if tok.get(b) == c:
                del tok[b]
                return b
        return None

    def on_evicted(self, block: int, key: Hashable) -> None:
        self._block_next.pop(block, None)

    def eviction_order(self) -> Iterable[int]:
        live = [e for e in self._heap if self._token.get(e[3]) == e[2]]
        return [e[3] for e in sorted(live)]

    def reset(self) -> None:
        self._heap.clear()
        self._token.clear()
        self._block_next.clear()
