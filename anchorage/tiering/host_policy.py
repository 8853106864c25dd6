"""Anchorage's host-tier replacement policy: which host-memory chunks to keep when host
memory fills, from the same predictions the GPU policy uses. One object, called unchanged
by the engine (``anchorage.node_agent.offload.policy``, vLLM's ``CachePolicy`` seam) and by
the simulator (``anchorage.tiering.offload_model``).

Specification
-------------
Interface (vLLM 0.32's ``CachePolicy``, over opaque keys; values are the caller's chunk
records and expose ``ref_cnt``: ``> 0`` loading, ``-1`` being stored, ``0`` evictable):
``get``, ``insert``, ``remove``, ``touch(keys, rid)``, ``on_store_miss(keys, rid)``,
``on_request_finished(key_groups, insertion_only, reused, rid)``, ``evict(n, protected)``
(atomic: exactly ``n`` evictable keys not in ``protected``, or None and no change),
``clear``, ``mark_evictable`` / ``mark_non_evictable``. ``rid`` identifies the request whose
access it is (vLLM's ``ReqContext.req_id``).

Recency, exactly vLLM's ``LRUCachePolicy``: a global rank, a new one for an inserted key
and, in reverse order (a prefix's head ends most recent), for each present key of a
``touch`` or of ``on_request_finished``'s keys in head-to-tail order (``on_store_miss`` is a
touch). Each key also records when it was last used (``clock()``).

Groups: a key belongs to the session of the last request that used it (``returns.
session_of(rid)``); a key used by two sessions (or by a session and a request without one)
is *shared*; a key never used by a session is *anonymous*.

Score ``K`` (predicted absolute time of the key's next use; larger = evicted first), at
``now = clock()``:

- session key: ``returns.next_use_s(sid, now)`` (``anchorage.tiering.returns``: active now,
  the expected return after a tool call or a plain turn, inf once ended; None -> as
  anonymous);
- shared key: ``now + min(ia, now - last)`` (``ia``: EWMA, weight ``shared_ewma`` 0.2, of
  the intervals between the key's uses; ``now - last`` until there is one): a prefix many
  sessions use is expected back at its use rate, and one idle for long loses that;
- anonymous key: ``now + (now - last)`` (recency).

Victims: among evictable keys not in ``protected``, those not pinned by the temporal
controller (``returns.pinned``: a session it offloaded, not back yet) first, then the
largest ``K``, then the oldest rank. Within one session, keys share ``K`` and go oldest
rank first, i.e. a prefix's tail first. Without ``returns`` every key is anonymous and the
order is exactly vLLM's LRU (last use, then rank: the clock never goes back).

Cost: per group a lazily invalidated heap of (rank, key); ``evict`` merges the groups'
fronts, O((G + n) log G) for G groups with evictable keys; the other calls O(1) per key.
State: per key present (rank, last use, group, use interval), per group its heap.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from anchorage.tiering.returns import SessionReturns

ANON, SHARED = ("anon",), ("shared",)


class _Group:
    __slots__ = ("gid", "heap", "n", "sid")

    def __init__(self, gid: Hashable, sid: Hashable | None):
        self.gid = gid
        self.sid = sid
        self.n = 0  # keys it owns
        self.heap: list[tuple[int, Hashable]] = []


class HostPolicy:
    name = "anchorage"

    def __init__(self, cache_capacity: int, returns: SessionReturns | None = None, *,
                 clock: Callable[[], float] = time.monotonic, shared_ewma: float = 0.2):
        if not 0 < shared_ewma <= 1:
            raise ValueError(f"shared_ewma must be in (0, 1], got {shared_ewma!r}")
        self.cache_capacity = cache_capacity
        self.returns = returns
        self.clock = clock
        self.w = shared_ewma
        self.chunks: dict[Hashable, Any] = {}
        self.rank: dict[Hashable, int] = {}
        self.last: dict[Hashable, float] = {}
        self.ia: dict[Hashable, float] = {}
        self.group_of: dict[Hashable, _Group] = {}
        self.groups: dict[Hashable, _Group] = {}
        self.evictable: set[Hashable] = set()
        self._next = 0

    # -- bookkeeping ----------------------------------------------------------------------

    def _group(self, gid: Hashable, sid: Hashable | None) -> _Group:
        g = self.groups.get(gid)
        if g is None:
            g = self.groups[gid] = _Group(gid, sid)
        return g

    def _owner(self, key: Hashable, sid: Hashable | None, fresh: bool) -> _Group:
        """The group of ``key`` after a use by session ``sid`` (``fresh``: just inserted)."""
        if fresh or key not in self.group_of:  # a store: the storing request's
            return self._group(("s", sid), sid) if sid is not None else self._group(ANON, None)
        g = self.group_of[key]
        if g.sid == sid and g.gid is not SHARED:
            return g
        return self._group(SHARED, None)

    def _use(self, key: Hashable, rid: Any, now: float, fresh: bool = False) -> None:
        self._next += 1
        self.rank[key] = self._next
        prev = self.last.get(key)
        if prev is not None and not fresh:
            gap = max(0.0, now - prev)
            old = self.ia.get(key)
            self.ia[key] = gap if old is None else (1 - self.w) * old + self.w * gap
        self.last[key] = now
        sid = self.returns.session_of(rid) if (self.returns is not None and rid is not None) else None
        g = self._owner(key, sid, fresh)
        old = self.group_of.get(key)
        if old is not g:
            if old is not None:
                self._disown(old)
            g.n += 1
            self.group_of[key] = g
        if key in self.evictable:
            heapq.heappush(g.heap, (self._next, key))

    def _recency(self, keys: Iterable[Hashable], rid: Any) -> None:
        now = self.clock()
        chunks = self.chunks
        for k in keys:
            if k in chunks:
                self._use(k, rid, now)

    # -- CachePolicy ----------------------------------------------------------------------

    def get(self, key: Hashable) -> Any:
        return self.chunks.get(key)

    def insert(self, key: Hashable, chunk: Any, rid: Any = None) -> None:
        self.chunks[key] = chunk
        if chunk.ref_cnt == 0:
            self.evictable.add(key)
        self.ia.pop(key, None)
        self._use(key, rid, self.clock(), fresh=True)

    def _disown(self, g: _Group) -> None:
        g.n -= 1
        if g.n <= 0 and self.groups.get(g.gid) is g:
            del self.groups[g.gid]

    def remove(self, key: Hashable) -> None:
        del self.chunks[key]
        for d in (self.rank, self.last, self.ia):
            d.pop(key, None)
        g = self.group_of.pop(key, None)
        if g is not None:
            self._disown(g)
        self.evictable.discard(key)

    def touch(self, keys: Iterable[Hashable], rid: Any = None) -> None:
        self._recency(reversed(list(keys)), rid)

    def on_store_miss(self, keys: Iterable[Hashable], rid: Any = None) -> None:
        self.touch(keys, rid)

    def on_request_finished(self, key_groups: Sequence[Sequence[Hashable]],
                            insertion_only: set, reused: set, rid: Any = None) -> None:
        keys = [k for grp in key_groups for k in grp]
        self._recency(reversed(keys), rid)

    def mark_evictable(self, key: Hashable) -> None:
        self.evictable.add(key)
        heapq.heappush(self.group_of[key].heap, (self.rank[key], key))

    def mark_non_evictable(self, key: Hashable) -> None:
        self.evictable.remove(key)

    def clear(self) -> None:
        for d in (self.chunks, self.rank, self.last, self.ia, self.group_of, self.groups):
            d.clear()
        self.evictable.clear()
        self._next = 0

    # -- eviction -------------------------------------------------------------------------

    def score(self, key: Hashable, now: float | None = None) -> float:
        """``K`` of a present key (the module's specification)."""
        now = self.clock() if now is None else now
        return self._score(self.group_of[key], key, now, {})

    def _score(self, g: _Group, key: Hashable, now: float, memo: dict) -> float:
        if g.sid is not None:
            k = memo.get(g.gid)
            if k is None:
                k = self.returns.next_use_s(g.sid, now) if self.returns is not None else None
                memo[g.gid] = k = (math.nan if k is None else k)
            if k == k:  # not NaN: the session's prediction
                return k
        age = max(0.0, now - self.last[key])
        if g is self.groups.get(SHARED):
            ia = self.ia.get(key)
            return now + (age if ia is None else min(ia, age))
        return now + age

    def _front(self, g: _Group, protected: set, popped: list) -> tuple[int, Hashable] | None:
        heap, ev, rank, gof = g.heap, self.evictable, self.rank, self.group_of
        while heap:
            e = heapq.heappop(heap)
            r, k = e
            if k not in ev or rank.get(k) != r or gof.get(k) is not g:
                continue  # stale
            popped.append((g, e))
            if k in protected:
                continue
            return e
        return None

    def evict(self, n: int, protected: set) -> list[tuple[Hashable, Any]] | None:
        if n == 0:
            return []
        if n > len(self.evictable):
            return None
        now = self.clock()
        memo: dict = {}
        pinned = self.returns.pinned if self.returns is not None else None
        popped: list = []
        pq: list = []

        def push(g: _Group) -> None:
            e = self._front(g, protected, popped)
            if e is not None:
                k = e[1]
                pin = pinned(k) if pinned is not None else False
                heapq.heappush(pq, (pin, -self._score(g, k, now, memo), e[0], k, g))

        for g in list(self.groups.values()):
            push(g)
        chosen: list[tuple[Hashable, Any]] = []
        taken: set = set()
        while pq and len(chosen) < n:
            _, _, _, k, g = heapq.heappop(pq)
            if k not in taken:
                taken.add(k)
                chosen.append((k, self.chunks[k]))
            push(g)
        if len(chosen) < n:
            taken = set()  # atomic: nothing is evicted
        for g, e in popped:  # give back what was looked at and not taken
            if e[1] not in taken:
                heapq.heappush(g.heap, e)
        if len(chosen) < n:
            return None
        for k, _ in chosen:
            self.remove(k)
        return chosen
