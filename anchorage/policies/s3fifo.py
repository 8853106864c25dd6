"""`s3fifo`: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP'23)
adapted to the block pool.

Specification
-------------
Inputs: block keys as they are cached, hit and evicted; the pool's capacity ``c``.
Parameters: ``small_frac`` = 0.1 (size of the small queue S as a fraction of ``c``),
``max_freq`` = 3 (a block's access counter saturates there), ``promote_freq`` = 1 (a block
leaving S with at least this many hits since it was cached moves to M: "accessed at least
once while in S", libCacheSim's ``move-to-main-threshold=1``), ``ghost_frac`` = 0.9 (ghost queue G holds that fraction of ``c`` keys,
the size of M).

- Caching a block under key ``k``: if ``k`` is in G it enters M's head, else S's head;
  its counter starts at 0.
- A hit: ``freq <- min(freq + 1, max_freq)`` (no queue movement).
- Eviction: if ``|S| >= small_frac * c``, take S's tail: if ``freq >= promote_freq`` it
  moves to M's head (counter reset to 0) and eviction continues, else it is evicted and
  its key enters G. Otherwise take M's tail: if ``freq > 0`` it is reinserted at M's head
  with ``freq - 1`` and eviction continues, else it is evicted.

Adaptation to the pool: S and M contain every cached block (in use or free) and ``|S|``
counts them all, but only cached *free* blocks can be taken from a tail; a block in use
keeps its queue position and is passed over (so the candidate tail is the oldest free
block of that queue). If the chosen queue has no free block, the other queue is used.
A block's queue position is its insertion sequence number, so evictable blocks live in
one heap per queue keyed by that number.

Cost: O(log n) per victim, amortised (each block is moved at most ``max_freq + 1`` times
between evictions) and per freed block; O(1) per hit. G is bounded by ``ghost_frac * c``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterable

from anchorage.policies._lazyheap import LazyHeap
from anchorage.policies.base import EvictionPolicy, RequestContext

_S, _M = 0, 1


class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"

    def __init__(self, small_frac: float = 0.1, max_freq: int = 3, promote_freq: int = 1,
                 ghost_frac: float = 0.9, capacity_blocks: int | None = None) -> None:
        if not 0 < small_frac < 1:
            raise ValueError("small_frac must be in (0, 1)")
        self.small_frac, self.max_freq = small_frac, max_freq
        self.promote_freq, self.ghost_frac = promote_freq, ghost_frac
        self._c = capacity_blocks or 0
        self._queue: dict[int, int] = {}   # cached block -> _S | _M
        self._pos: dict[int, int] = {}     # cached block -> insertion seq in its queue
        self._freq: dict[int, int] = {}
        self._size = [0, 0]
        self._free = (LazyHeap(), LazyHeap())  # evictable blocks per queue, by position
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._seq = 0

    def attach(self, pool) -> None:
        super().attach(pool)
        if not self._c:
            self._c = pool.capacity_blocks

    def _insert(self, b: int, q: int) -> None:
        self._seq += 1
        self._queue[b] = q
        self._pos[b] = self._seq

    # -- notifications --------------------------------------------------------------------

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        queue, free = self._queue, self._free
        for b in were_free:
            q = queue.get(b)
            if q is not None:
                free[q].remove(b)
        freq, mx = self._freq, self.max_freq
        for b in blocks:
            f = freq.get(b, 0)
            if f < mx:
                freq[b] = f + 1

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        ghost = self._ghost
        for b, k in zip(blocks, keys):
            if k in ghost:
                del ghost[k]
                q = _M
            else:
                q = _S
            self._insert(b, q)
            self._freq[b] = 0
            self._size[q] += 1

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        queue, pos, free = self._queue, self._pos, self._free
        for b in blocks:
            if b not in queue:  # never seen cached (cached behind the policy's back): new
                self._insert(b, _S)
                self._freq[b] = 0
                self._size[_S] += 1
            free[queue[b]].push(b, pos[b])

    def pop_victim(self) -> int | None:
        fs, fm = self._free
        freq = self._freq
        small_target = self.small_frac * self._c
        while fs or fm:
            use_small = (self._size[_S] >= small_target and fs) or not fm
            if use_small:
                b = fs.pop()
                if freq[b] >= self.promote_freq:
                    self._size[_S] -= 1
                    self._size[_M] += 1
                    self._insert(b, _M)
                    freq[b] = 0
                    fm.push(b, self._pos[b])
                    continue
                return b
            b = fm.pop()
            if freq[b] > 0:
                freq[b] -= 1
                self._insert(b, _M)
                fm.push(b, self._pos[b])
                continue
            return b
        return None

    def on_evicted(self, block: int, key: Hashable) -> None:
        q = self._queue.pop(block, None)
        if q is None:
            return
        self._pos.pop(block, None)
        self._freq.pop(block, None)
        self._size[q] -= 1
        if q == _S and key not in self.pool.cached:
            ghost = self._ghost
            ghost[key] = None
            cap = max(1, int(self.ghost_frac * self._c))
            while len(ghost) > cap:
                ghost.popitem(last=False)

    # -- inspection -----------------------------------------------------------------------

    def eviction_order(self) -> Iterable[int]:
        """The evictable blocks (S's then M's, oldest first): a set, not an exact victim
        order, since victim choice moves blocks between queues."""
        return list(self._free[_S].ordered()) + list(self._free[_M].ordered())

    def reset(self) -> None:
        for q in (_S, _M):
            for b in self._free[q].ordered():
                self._queue.pop(b, None)
                self._pos.pop(b, None)
                self._freq.pop(b, None)
                self._size[q] -= 1
            self._free[q].clear()


POLICIES = {"s3fifo": lambda block_size=16, **params: S3FIFOPolicy(**params)}
