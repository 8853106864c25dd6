"""`arc`: Adaptive Replacement Cache (Megiddo & Modha, FAST'03) adapted to the block pool.

Specification
-------------
Inputs: block keys as they are cached, hit, freed and evicted; the pool's capacity ``c``
(``capacity_blocks``). No parameters.

ARC splits the cache into T1 (keys seen once recently) and T2 (keys seen at least twice),
and remembers the keys it evicted from each in ghost lists B1 and B2. A target size ``p``
for T1 adapts on ghost hits:

- a block is cached under key ``k`` (a miss): if ``k`` is in B1, ``p <- min(c, p +
  max(1, |B2|/|B1|))`` and the block enters T2; if ``k`` is in B2, ``p <- max(0, p -
  max(1, |B1|/|B2|))`` and it enters T2; otherwise it enters T1. ``k`` leaves its ghost list.
- a hit moves the block to T2 (its MRU end once it is freed again).
- REPLACE (ARC's victim choice): evict from T1 if ``|T1| > p`` (or ``|T1| == p`` and the
  request that triggered the eviction was a B2 ghost hit), else from T2; the victim is the
  LRU block of that list, and its key goes to the MRU end of B1 or B2.
- ghosts are trimmed as in ARC: ``|T1| + |B1| <= c`` and ``|T1|+|T2|+|B1|+|B2| <= 2c``.

Adaptation to the pool: ``|T1|`` and ``|T2|`` count every cached block (in use or free),
but only cached *free* blocks can be victims, so REPLACE picks among the evictable blocks
of the chosen list and falls back to the other list when the chosen one has none. Within
a list, blocks are in the order they became free (vLLM's order: a chain's tail first),
which is ARC's recency order because a block is freed when its last user finishes. A key
evicted while a duplicate physical block still holds it is not remembered as a ghost.

Cost: O(1) per touch and per victim (ordered dicts); state bounded by 2c keys.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterable

from anchorage.policies.base import EvictionPolicy, RequestContext

_T1, _T2 = 1, 2


class ARCPolicy(EvictionPolicy):
    name = "arc"

    def __init__(self, capacity_blocks: int | None = None) -> None:
        self._c = capacity_blocks or 0
        self.p = 0.0
        self._list: dict[int, int] = {}        # cached block -> _T1 | _T2
        self._size = {_T1: 0, _T2: 0}           # cached blocks per list (in use or free)
        self._free = {_T1: OrderedDict(), _T2: OrderedDict()}  # evictable, LRU first
        self._b1: OrderedDict[Hashable, None] = OrderedDict()
        self._b2: OrderedDict[Hashable, None] = OrderedDict()
        self._b2_hit = False  # the latest miss was a B2 ghost hit (REPLACE's tie rule)

    def attach(self, pool) -> None:
        super().attach(pool)
        if not self._c:
            self._c = pool.capacity_blocks

    # -- notifications --------------------------------------------------------------------

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        free, lst, size = self._free, self._list, self._size
        for b in were_free:
            li = lst.get(b)
            if li is not None:
                free[li].pop(b, None)
        for b in blocks:
            li = lst.get(b)
            if li == _T1:
                lst[b] = _T2
                size[_T1] -= 1
                size[_T2] += 1

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        b1, b2, c = self._b1, self._b2, self._c
        for b, k in zip(blocks, keys):
            if k in b1:
                self.p = min(float(c), self.p + max(1.0, len(b2) / len(b1)))
                del b1[k]
                li = _T2
                self._b2_hit = False
            elif k in b2:
                self.p = max(0.0, self.p - max(1.0, len(b1) / len(b2)))
                del b2[k]
                li = _T2
                self._b2_hit = True
            else:
                li = _T1
                self._b2_hit = False
            self._list[b] = li
            self._size[li] += 1
        self._trim()

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        free, lst = self._free, self._list
        for b in blocks:
            li = lst.get(b)
            if li is None:  # never seen cached (cached behind the policy's back): seen once
                li = lst[b] = _T1
                self._size[_T1] += 1
            free[li][b] = None

    def pop_victim(self) -> int | None:
        f1, f2 = self._free[_T1], self._free[_T2]
        t1 = self._size[_T1]
        from_t1 = t1 > self.p or (self._b2_hit and t1 == self.p)
        if from_t1 and f1:
            q = f1
        elif f2:
            q = f2
        elif f1:
            q = f1
        else:
            return None
        return q.popitem(last=False)[0]

    def on_evicted(self, block: int, key: Hashable) -> None:
        li = self._list.pop(block, None)
        if li is None:
            return
        self._size[li] -= 1
        if key in self.pool.cached:  # a duplicate block still holds the key: not a ghost
            return
        ghost = self._b1 if li == _T1 else self._b2
        ghost[key] = None
        self._trim()

    def _trim(self) -> None:
        c = self._c
        b1, b2 = self._b1, self._b2
        while b1 and self._size[_T1] + len(b1) > c:
            b1.popitem(last=False)
        while b2 and self._size[_T1] + self._size[_T2] + len(b1) + len(b2) > 2 * c:
            b2.popitem(last=False)
        while b1 and self._size[_T1] + self._size[_T2] + len(b1) + len(b2) > 2 * c:
            b1.popitem(last=False)

    # -- inspection -----------------------------------------------------------------------

    def eviction_order(self) -> Iterable[int]:
        """Victims in order if nothing else happened (simulates REPLACE on copies)."""
        f1, f2 = list(self._free[_T1]), list(self._free[_T2])
        t1, out = self._size[_T1], []
        i = j = 0
        while i < len(f1) or j < len(f2):
            if (t1 > self.p or (self._b2_hit and t1 == self.p)) and i < len(f1) or j >= len(f2):
                out.append(f1[i])
                i += 1
                t1 -= 1
            else:
                out.append(f2[j])
                j += 1
        return out

    def reset(self) -> None:
        for li in (_T1, _T2):
            for b in self._free[li]:
                self._list.pop(b, None)
                self._size[li] -= 1
            self._free[li].clear()

    def state_size_bytes(self) -> int:
        return 8 * (len(self._b1) + len(self._b2)) + 64


POLICIES = {"arc": lambda block_size=16, **params: ARCPolicy(**params)}
