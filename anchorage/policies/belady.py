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

Cost: one backward pass over the trace to precompute next uses; O(log n) per victim and
per freed block (a heap with lazy invalidation); O(1) per hit and cached block; per
request, O(k) for its k keys plus O(log n) for each evictable block of its keys that it
does not hit (those are re-prioritised; the hit ones leave the heap anyway).
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
        # evictable blocks: heap of (-next use, -depth, token, block), first victim on
        # top; an entry is live while its token is the block's current one
        self._heap: list[tuple] = []
        self._token: dict[int, int] = {}
        self._counter = 0
        # keys of the arriving request's hit prefix whose next use moved: their blocks
        # leave the heap when hit; if the admission fails they are re-prioritised later
        self._pending: list[Hashable] = []

    def attach(self, pool) -> None:
        super().attach(pool)
        if self._inputs is not None:  # a request whose prompt cannot fit never runs
            cap = pool.capacity_blocks
            limits = [0 if pool.blocks_needed(n) > cap else lim
                      for n, lim in zip(self._inputs, self._limits)]
            if limits != self._limits:
                self._limits = limits
                self._next = next_use_table(self._keys, limits)

    # -- heap -----------------------------------------------------------------------------

    def _push(self, b: int) -> None:
        """(Re-)insert evictable block ``b`` with its current priority."""
        pool = self.pool
        key = pool.block_key[b]
        cur = pool.cached.get(key) if key is not None else None
        if cur is None:
            nu = INF
        elif type(cur) is int:
            nu = self._key_next.get(key, INF) if cur == b else INF
        else:  # duplicates: only the copy lookups find can be hit
            nu = self._key_next.get(key, INF) if next(iter(cur)) == b else INF
        self._counter += 1
        c = self._counter
        self._token[b] = c
        heapq.heappush(self._heap, (-nu, -self._depth.get(b, 0), c, b))
        if len(self._heap) > 1024 and len(self._heap) > 2 * len(self._token):
            tok = self._token
            self._heap = [e for e in self._heap if tok.get(e[3]) == e[2]]
            heapq.heapify(self._heap)

    def _reprioritise(self, key: Hashable) -> None:
        b = self.pool.get_cached_block(key)
        if b is not None and b in self._token:
            self._push(b)

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, []
        for k in pending:
            self._reprioritise(k)

    # -- notifications --------------------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        if self._pending:
            self._flush_pending()
        if ctx.seq < 0:
            return
        row = self._next[ctx.seq]
        key_next = self._key_next
        keys = ctx.keys
        hit = self.pool.num_hit_blocks(keys, ctx.input_length)
        pending = self._pending
        for i, (k, nu) in enumerate(zip(keys, row)):
            if key_next.get(k, INF) != nu:
                key_next[k] = nu
                if i < hit:
                    pending.append(k)
                else:
                    self._reprioritise(k)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        self._pending = []  # the hit blocks are in use now: no longer in the heap
        tok = self._token
        for b in were_free:
            del tok[b]

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        depth = self._depth
        for j, b in enumerate(blocks):
            depth[b] = start + j

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        # _push, inlined: this runs once per freed block
        pool = self.pool
        bkey, cached = pool.block_key, pool.cached
        key_next, depth, tok, heap = self._key_next, self._depth, self._token, self._heap
        push = heapq.heappush
        c = self._counter
        for b in blocks:
            key = bkey[b]
            cur = cached.get(key) if key is not None else None
            if cur is None:
                nu = INF
            elif type(cur) is int:
                nu = key_next.get(key, INF) if cur == b else INF
            else:
                nu = key_next.get(key, INF) if next(iter(cur)) == b else INF
            c += 1
            tok[b] = c
            push(heap, (-nu, -depth.get(b, 0), c, b))
        self._counter = c
        if len(heap) > 1024 and len(heap) > 2 * len(tok):
            self._heap = [e for e in heap if tok.get(e[3]) == e[2]]
            heapq.heapify(self._heap)

    def pop_victim(self) -> int | None:
        if self._pending:
            self._flush_pending()
        heap, tok = self._heap, self._token
        while heap:
            _, _, c, b = heapq.heappop(heap)
            if tok.get(b) == c:
                del tok[b]
                return b
        return None

    def on_evicted(self, block: int, key: Hashable) -> None:
        self._depth.pop(block, None)
        # a duplicate copy of the key, if any, is now the one lookups find
        self._reprioritise(key)

    def eviction_order(self) -> Iterable[int]:
        if self._pending:
            self._flush_pending()
        tok = self._token
        return [e[3] for e in sorted(e for e in self._heap if tok.get(e[3]) == e[2])]

    def reset(self) -> None:
        self._heap.clear()
        self._token.clear()
        self._depth.clear()
        self._pending = []
