"""The simulator's model of vLLM 0.32's CPU offloading manager
(``vllm/v1/kv_offload/cpu/manager.py`` ``CPUOffloadingManager``): host chunks, their
reference counts, the stores and loads the offloading connector asks for, and the host
policy deciding the victims. The engine runs vLLM's class; this one runs the same policy
objects in the simulator, so both keep the same chunks
(``tests/node_agent/test_host_tier_parity.py``).

Specification
-------------
``HostStore(num_chunks, policy)``; a chunk record is ``Chunk(chunk_id)`` with ``ref_cnt``
(-1: being stored, 0: ready and evictable, > 0: being loaded by that many transfers).

- ``lookup(key)``: ``"miss"``, ``"pending"`` (being stored) or ``"hit"``.
- ``prepare_store(keys, rid)``: the keys not held are the candidates (``keys_to_store``);
  held ready ones count as the request's reuses. The policy sees the candidates first
  (``on_store_miss``, once per request). If the free chunks do not suffice, the policy
  evicts the difference among evictable keys, the offered ones protected; when it cannot,
  nothing happens and None is returned (vLLM: an allocation failure). The candidates are
  inserted, being stored. Returns ``(keys_to_store, evicted)``.
- ``complete_store(keys, success=True)``: ready (evictable); on failure dropped.
- ``prepare_load(keys, rid)``: pins ready chunks (``ref_cnt += 1``); ``complete_load``
  unpins.
- ``request_finished(rid)``: the request's accesses in prefix order (the keys it stored or
  found held, then those it loaded), the ones it only inserted and the ones it reused go
  to ``policy.on_request_finished``.
- Counters: ``stored``, ``evicted``, ``loaded``, ``store_failures`` (allocation failures).

The policy objects: ``anchorage.tiering.host_policy.HostPolicy`` (Anchorage, or vLLM's LRU
order without predictions) and ``anchorage.tiering.host_baselines.ARCHostPolicy``.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any


class Chunk:
    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int):
        self.chunk_id = chunk_id
        self.ref_cnt = -1


class _Access:
    __slots__ = ("inserted", "keys", "misses", "reused", "seen")

    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.seen: set[Hashable] = set()
        self.inserted: set[Hashable] = set()
        self.reused: set[Hashable] = set()
        self.misses: set[Hashable] = set()


class HostStore:
    def __init__(self, num_chunks: int, policy: Any):
        self.num_chunks = num_chunks
        self.policy = policy
        self._allocated = 0
        self._free: list[int] = []
        self._access: dict[Any, _Access] = {}
        self.stored = self.evicted = self.loaded = self.store_failures = 0

    @property
    def used_chunks(self) -> int:
        return self._allocated - len(self._free)

    def _num_free(self) -> int:
        return len(self._free) + self.num_chunks - self._allocated

    def _alloc(self) -> Chunk:
        if self._allocated < self.num_chunks:
            self._allocated += 1
            return Chunk(self._allocated - 1)
        return Chunk(self._free.pop())

    def _acc(self, rid: Any) -> _Access:
        a = self._access.get(rid)
        if a is None:
            a = self._access[rid] = _Access()
        return a

    def _record(self, a: _Access, keys, reused=()) -> None:
        for k in keys:
            if k not in a.seen:
                a.seen.add(k)
                a.keys.append(k)
        a.reused.update(k for k in reused if k not in a.inserted)

    def lookup(self, key: Hashable) -> str:
        c = self.policy.get(key)
        if c is None:
            return "miss"
        return "hit" if c.ref_cnt >= 0 else "pending"

    def prepare_store(self, keys: Collection[Hashable], rid: Any
                      ) -> tuple[list[Hashable], list[Hashable]] | None:
        keys = list(keys)
        pol = self.policy
        new, ready = [], []
        for k in keys:
            c = pol.get(k)
            if c is None:
                new.append(k)
            elif c.ref_cnt >= 0:
                ready.append(k)
        a = self._acc(rid)
        misses = [k for k in new if k not in a.misses]
        if misses:
            pol.on_store_miss(misses, rid)
            a.misses.update(misses)
        rec = set(new) | set(ready)
        self._record(a, [k for k in keys if k in rec], reused=ready)
        if not new:
            return [], []
        need = len(new) - self._num_free()
        evicted: list[Hashable] = []
        if need > 0:
            out = pol.evict(need, set(keys))
            if out is None:
                self.store_failures += 1
                return None
            for k, c in out:
                self._free.append(c.chunk_id)
                evicted.append(k)
            self.evicted += len(evicted)
        for k in new:
            pol.insert(k, self._alloc(), rid)
        a.inserted.update(new)
        self.stored += len(new)
        return new, evicted

    def complete_store(self, keys: Collection[Hashable], success: bool = True) -> None:
        pol = self.policy
        for k in keys:
            c = pol.get(k)
            if c is None or c.ref_cnt >= 0:
                continue
            if success:
                c.ref_cnt = 0
                pol.mark_evictable(k)
            else:
                pol.remove(k)
                self._free.append(c.chunk_id)

    def prepare_load(self, keys: Collection[Hashable], rid: Any) -> None:
        pol = self.policy
        for k in keys:
            c = pol.get(k)
            assert c is not None and c.ref_cnt >= 0, "loading a chunk that is not ready"
            if c.ref_cnt == 0:
                pol.mark_non_evictable(k)
            c.ref_cnt += 1
        self.loaded += len(keys)
        self._record(self._acc(rid), keys, reused=keys)

    def complete_load(self, keys: Collection[Hashable]) -> None:
        pol = self.policy
        for k in keys:
            c = pol.get(k)
            assert c is not None and c.ref_cnt > 0
            c.ref_cnt -= 1
            if c.ref_cnt == 0:
                pol.mark_evictable(k)

    def request_finished(self, rid: Any) -> None:
        a = self._access.pop(rid, None)
        if a is None:
            return
        self.policy.on_request_finished((tuple(a.keys),), a.inserted - a.reused, a.reused,
                                        rid)
