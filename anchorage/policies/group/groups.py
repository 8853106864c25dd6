"""The group/heap mechanism of group-scored eviction: groups, free order, versioned lazy
heap, victims. No learning: the scores it orders by are set by the scorers.

Specification
-------------
Every cached block the policy saw assigned belongs to one ``Group`` (``assign``). A group
has a kind (``ANCHOR``, ``THREAD``, ``OUTPUT``, ``STALE``, ``DUP``; ``ANON`` for blocks freed
without ever being assigned), its free blocks in the order they became free
(``free``: block -> (free sequence number, time freed); a chain's tail first, exactly LRU
order inside the group) and a score:

- ``K``: absolute predicted next-use time (larger = evicted first; ``inf``: no reuse
  expected, ``-inf``: needed before anything), or None: *recency*, the key of the group is
  then ``epoch + mult * T(age) + add`` with ``age = epoch - t_front`` (``t_front``: when
  the group's front block became free; ``epoch``: the last re-scoring time),
  ``T(age) = age`` (``recency_scale_s`` inf) or ``s * (exp(age / s) - 1)``, and ``inf``
  beyond ``horizon_s`` (far reuse). Monotone in ``age``, so among recency groups the
  order is exactly LRU.

The victim is the front block of the group with the largest key (ties: the block freed
earliest). Groups with free blocks sit in a heap of ``(-key, front seq, version, group)``
with lazy invalidation: a group's ``ver`` changes whenever its front or its score does, and
entries with an old version are dropped when they surface. Versions are unique across
groups, so entries never compare groups. Costs: O(log G) per victim, O(1) per touched block
(a group whose front left is marked *touched*), O(log G) per touched group at ``flush``.

``touch(g)`` marks a group whose score or front changed; the owner re-scores every touched
group with free blocks and pushes it (``flush``), and re-scores all of them at once
(``rescore``). A group with no block assigned and none free is dropped (``on_drop``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable

INF = math.inf
ANCHOR, THREAD, OUTPUT, STALE, DUP, ANON = 0, 1, 2, 3, 4, 5
KINDS = ("anchor", "thread", "output", "stale", "dup", "anon")
_GROUP_IDS = itertools.count(1)


class Group:
    """One scored set of cached blocks (see the module spec). ``sess`` and ``agent`` are
    the workload model's records the group's scorer reads (None where not applicable)."""

    __slots__ = ("kind", "key", "sess", "agent", "free", "n", "ver", "K", "mult", "add",
                 "orph", "hold")

    def __init__(self, kind: int, key: Hashable, sess: Any = None, agent: Any = None):
        self.kind = kind
        self.key = key
        self.sess = sess
        self.agent = agent
        self.free: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self.n = 0          # blocks assigned (free or in use)
        self.ver = next(_GROUP_IDS) << 32
        self.K: float | None = None  # absolute predicted next use, or None: recency
        self.mult = 1.0               # recency key: epoch + mult * T(age) + add
        self.add = 0.0
        self.orph: Hashable = None  # the last request that orphaned this thread's blocks
        self.hold = 0  # queued requests that will hit this group at admission


class GroupHeap:
    """Groups with free blocks, ordered by key; the victims (module spec)."""

    def __init__(self, recency_scale_s: float = INF, horizon_s: float = INF):
        self.recency_scale_s = recency_scale_s
        self.horizon_s = horizon_s
        self._plain = recency_scale_s == INF and horizon_s == INF
        self.block_group: dict[int, Group] = {}
        self.nonempty: dict[int, Group] = {}   # id(group) -> group with free blocks
        self.touched: dict[int, Group] = {}
        self.hits_by_kind = [0] * len(KINDS)   # free blocks hit again, per group kind
        self.epoch = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self._anon: Group | None = None
        #: called with a group that has no block left (its owner unlinks it)
        self.on_drop: Callable[[Group], None] = lambda g: None

    # -- membership -----------------------------------------------------------------------

    def assign(self, blocks: Iterable[int], g: Group) -> None:
        """``blocks`` (in use) now belong to ``g``."""
        bg = self.block_group
        for b in blocks:
            old = bg.get(b)
            if old is not g:
                if old is not None:
                    old.n -= 1
                bg[b] = g
                g.n += 1

    def move_free(self, thread: Group, part: OrderedDict, g: Group) -> None:
        """Free blocks ``part`` (taken out of ``thread.free``) become ``g``'s, in order."""
        bg = self.block_group
        for b in part:
            bg[b] = g
        g.free = part
        k = len(part)
        thread.n -= k
        g.n += k
        self.touched[id(g)] = g

    def detach(self, g: Group) -> None:
        """``g``'s free blocks were taken away (``move_free``): its heap entry is stale."""
        g.ver += 1
        self.nonempty.pop(id(g), None)
        self.touched[id(g)] = g

    def touch(self, g: Group) -> None:
        self.touched[id(g)] = g

    def anon_group(self) -> Group:
        """The group of blocks freed without ever being assigned (recency order)."""
        g = self._anon
        if g is None:
            g = self._anon = Group(ANON, "anon")
        return g

    # -- free order -----------------------------------------------------------------------

    def freed(self, blocks: list[int], t: float) -> None:
        """``blocks`` became evictable at ``t`` (in vLLM's free order). A block never
        assigned joins the anonymous recency group."""
        bg = self.block_group
        touched = self.touched
        seq = self._seq
        for b in blocks:
            g = bg.get(b)
            if g is None:
                g = bg[b] = self.anon_group()
                g.n += 1
            seq += 1
            if not g.free:
                touched[id(g)] = g
            g.free[b] = (seq, t)
        self._seq = seq

    def unfree(self, blocks: list[int]) -> None:
        """``blocks`` stopped being evictable (hit). Unknown blocks are ignored."""
        bg = self.block_group
        touched = self.touched
        hk = self.hits_by_kind
        for b in blocks:
            g = bg.get(b)
            if g is None:
                continue
            free = g.free
            if b not in free:
                continue
            if next(iter(free)) == b:
                touched[id(g)] = g
            del free[b]
            hk[g.kind] += 1

    def evicted(self, block: int) -> Group | None:
        """The pool dropped ``block``: forget it; returns the group it was in."""
        g = self.block_group.pop(block, None)
        if g is not None:
            g.n -= 1
            if g.n <= 0 and not g.free:
                self._drop(g)
        return g

    # -- scores and the heap --------------------------------------------------------------

    def flush(self, score: Callable[[Group], None]) -> None:
        """Re-score (``score(g)`` sets ``g.K``, ``g.mult``, ``g.add``) and re-push every
        touched group with free blocks; drop the touched groups left with no block."""
        touched = self.touched
        if not touched:
            return
        for g in touched.values():
            if g.free:
                score(g)
                self._push(g)
            else:
                self.nonempty.pop(id(g), None)
            if g.n <= 0 and not g.free:
                self._drop(g)
        touched.clear()

    def rescore(self, score: Callable[[Group], None], epoch: float) -> None:
        """Re-score every group with free blocks at ``epoch`` and rebuild the heap."""
        self.epoch = epoch
        heap = []
        for g in self.nonempty.values():
            score(g)
            g.ver += 1
            heap.append(self._entry(g))
        heapq.heapify(heap)
        self._heap = heap

    def pop(self) -> int | None:
        """The victim (front block of the group with the largest key), or None."""
        heap = self._heap
        while heap:
            top = heap[0]
            g = top[3]
            free = g.free
            if top[2] != g.ver or not free:
                heapq.heappop(heap)
                continue
            b = free.popitem(last=False)[0]
            g.ver += 1
            if free:
                seq, t = next(iter(free.values()))
                K = g.K
                if K is None:
                    if self._plain:
                        ep = self.epoch
                        age = ep - t
                        K = ep + (g.mult * age if age > 0 else 0.0) + g.add
                    else:
                        K = self.recency_key(g, t)
                heapq.heapreplace(heap, (-K, seq, g.ver, g))
            else:
                heapq.heappop(heap)
                self.nonempty.pop(id(g), None)
            return b
        return None

    def recency_key(self, g: Group, t: float) -> float:
        """Recency key of a group whose front block was freed at ``t`` (module spec)."""
        ep = self.epoch
        age = ep - t
        if age < 0:
            age = 0.0
        sc = self.recency_scale_s
        if sc != INF:
            x = age / sc
            age = sc * math.expm1(x) if x < 700 else INF
        T = g.mult * age + g.add
        if T > self.horizon_s:
            return INF
        return ep + T

    def _entry(self, g: Group) -> tuple:
        seq, t = next(iter(g.free.values()))
        K = g.K
        if K is None:
            K = self.recency_key(g, t)
        return (-K, seq, g.ver, g)

    def _push(self, g: Group) -> None:
        g.ver += 1
        self.nonempty[id(g)] = g
        heapq.heappush(self._heap, self._entry(g))

    def _drop(self, g: Group) -> None:
        self.nonempty.pop(id(g), None)
        if g is self._anon:
            self._anon = None
        else:
            self.on_drop(g)

    # -- inspection -----------------------------------------------------------------------

    @property
    def groups_with_free(self) -> int:
        return len(self.nonempty)

    def order(self) -> list[int]:
        """Evictable blocks, first victim first, if nothing else happened (O(n log n))."""
        heap = []
        for g in self.nonempty.values():
            items = list(g.free.items())
            if items:
                heap.append((self._key_at(g, items[0][1]), 0, items, g))
        heapq.heapify(heap)
        out = []
        while heap:
            _, i, items, g = heapq.heappop(heap)
            out.append(items[i][0])
            if i + 1 < len(items):
                heapq.heappush(heap, (self._key_at(g, items[i + 1][1]), i + 1, items, g))
        return out

    def _key_at(self, g: Group, st: tuple[int, float]) -> tuple[float, int]:
        seq, t = st
        K = g.K
        if K is None:
            K = self.recency_key(g, t)
        return (-K, seq)

    def clear(self) -> None:
        """Forget every evictable block and group (``reset_prefix_cache``)."""
        for g in list(self.nonempty.values()):
            g.free.clear()
            g.ver += 1
        self.nonempty.clear()
        self._heap.clear()
        self.block_group.clear()
        self._anon = None
