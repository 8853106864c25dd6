"""vLLM's own host-tier policies over plain keys, for the simulator: ``lru`` and ``arc``
(vLLM 0.32's ``vllm/v1/kv_offload/cpu/policies/{lru,arc}.py``), so that a simulated host
tier runs the baselines the engine runs. ``tests/node_agent/test_offload_policy_fidelity.py``
checks each against vLLM's class on random operation sequences.

Specification
-------------
``lru``: ``anchorage.tiering.host_policy.HostPolicy`` without session predictions: a
global rank (new on insert; in reverse order for each present key of a touch or of a
finished request's keys), victims by oldest rank among evictable, unprotected keys.

``ARCHostPolicy`` (Megiddo and Modha's ARC as vLLM implements it): T1 (chunks used once),
T2 (used again), ghost lists B1/B2 of evicted keys, target size ``p`` of T1 (starts at 0).
A store miss of a ghost key adapts ``p`` (B1 hit: ``p += max(1, |B2| / |B1|)``, at most
the capacity; B2 hit: ``p -= max(1, |B1| / |B2|)``, at least 0). Inserts go to T1 (leaving
the ghost lists). A touch moves a ready T1 chunk to T2's MRU end (a chunk being stored
stays in T1 as MRU), refreshes a T2 chunk, adapts on a ghost key. A finished request
refreshes the chunks it only inserted and promotes those it reused (T1 -> T2). Eviction
of ``n``: from T1 while ``|T1| >= int(p)`` (counting chunks already chosen), else from T2,
else T1 (LRU first in each, evictable and unprotected); evicted keys join B1/B2, each
trimmed to the capacity. Atomic: None and no change when ``n`` cannot be found.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from anchorage.tiering.host_policy import HostPolicy


def lru_policy(cache_capacity: int, clock=None) -> HostPolicy:
    p = HostPolicy(cache_capacity) if clock is None else HostPolicy(cache_capacity, clock=clock)
    p.name = "lru"
    return p


class ARCHostPolicy:
    name = "arc"

    def __init__(self, cache_capacity: int, **_: Any):
        self.cache_capacity = cache_capacity
        self.p = 0.0
        self.t1: OrderedDict[Hashable, Any] = OrderedDict()
        self.t2: OrderedDict[Hashable, Any] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def get(self, key: Hashable) -> Any:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: Hashable, chunk: Any, rid: Any = None) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: Hashable) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _ghost_hit(self, key: Hashable) -> bool:
        if key in self.b1:
            self.p = min(self.p + max(1, len(self.b2) / len(self.b1)), self.cache_capacity)
            self.b1.move_to_end(key)
            return True
        if key in self.b2:
            self.p = max(self.p - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[Hashable], rid: Any = None) -> None:
        for k in reversed(list(keys)):
            self._ghost_hit(k)

    def touch(self, keys: Iterable[Hashable], rid: Any = None) -> None:
        for k in reversed(list(keys)):
            if k in self.t1:
                c = self.t1.pop(k)
                if c.ref_cnt < 0:  # being stored: not a second use
                    self.t1[k] = c
                else:
                    self.t2[k] = c
            elif k in self.t2:
                self.t2.move_to_end(k)
            else:
                self._ghost_hit(k)

    def on_request_finished(self, key_groups: Sequence[Sequence[Hashable]],
                            insertion_only: set, reused: set, rid: Any = None) -> None:
        keys = [k for grp in key_groups for k in grp]
        for k in reversed(keys):
            if k in insertion_only:
                if k in self.t1:
                    self.t1.move_to_end(k)
                elif k in self.t2:
                    self.t2.move_to_end(k)
                continue
            if k in reused and k in self.t1:
                self.t2[k] = self.t1.pop(k)
            elif k in reused and k in self.t2:
                self.t2.move_to_end(k)

    def mark_evictable(self, key: Hashable) -> None:
        return

    def mark_non_evictable(self, key: Hashable) -> None:
        return

    def clear(self) -> None:
        for d in (self.t1, self.t2, self.b1, self.b2):
            d.clear()
        self.p = 0.0

    def evict(self, n: int, protected: set) -> list[tuple[Hashable, Any]] | None:
        if n == 0:
            return []
        out: list[tuple[Hashable, Any, bool]] = []
        t1_size = len(self.t1)
        it1, it2 = iter(self.t1.items()), iter(self.t2.items())

        def nxt(it):
            for k, c in it:
                if c.ref_cnt == 0 and k not in protected:
                    return k, c
            return None

        for _ in range(n):
            cand = None
            if t1_size >= int(self.p):
                e = nxt(it1)
                if e is not None:
                    cand, t1_size = (*e, True), t1_size - 1
            if cand is None:
                e = nxt(it2)
                if e is not None:
                    cand = (*e, False)
            if cand is None:
                e = nxt(it1)
                if e is None:
                    return None
                cand, t1_size = (*e, True), t1_size - 1
            out.append(cand)
        for k, _, from_t1 in out:
            if from_t1:
                del self.t1[k]
                self.b1[k] = None
            else:
                del self.t2[k]
                self.b2[k] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return [(k, c) for k, c, _ in out]
