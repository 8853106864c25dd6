"""An approximate per-replica index of cached block keys.

State: ``holders[key]`` = bitmask of the replicas believed to cache ``key`` (an int: no
per-key container objects for the garbage collector to walk); per replica, its keys in
LRU order, bounded by that replica's capacity (``None``: unbounded, for the precise index
fed by real KV events, whose own ``BlockRemoved`` events do the evicting).

- ``insert(r, keys)`` records that ``r`` now caches ``keys`` (a request ran there). Keys
  are touched tail first, so a chain's head (the shared anchor) is the most recent and
  is evicted last, as in vLLM where a freed request's tail blocks go first.
- ``match_len(r, keys)``: the number of leading keys of ``keys`` held by ``r``. Keys are
  chained (a key implies its prefix), so the held set is prefix-closed and a binary
  search finds the boundary in O(log n) lookups.
- ``match(keys)``: ``{r: match_len}`` for every replica holding ``keys[0]``; others match 0.
- ``apply_event(r, event)``: a device KV event (``anchorage.routing.events``); events about
  another medium (``medium`` other than ``"GPU"``: a host tier's) are ignored, so a GPU-only
  router stays GPU-only however the engine publishes.

``TieredPrefixIndex``: the device index above plus one per lower medium (``"CPU"``: the
offloading connector's host tier), each fed by the events of its medium: what llm-d's
kv-cache indexer (``llm-d-kv-cache`` ``pkg/kvcache/kvblock``: each key's pods with their
``DeviceTier``) and Dynamo's tier-aware router index hold. ``tier_runs(r, keys)`` =
``(device, lower)``: ``device`` leading keys held on the device, then ``lower`` more that
continue the prefix from the lower tiers (each key held by some tier; the scan stops at the
first key no tier of ``r`` holds). ``match_tiers(keys)``: ``{r: (device, lower)}`` for every
replica holding ``keys[0]`` in some tier.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterable, Sequence


def held_prefix_len(keys: Sequence[Hashable], held) -> int:
    """How many leading ``keys`` are in ``held``, for a prefix-closed ``held`` (chained
    keys: holding a key means holding its prefix): a binary search, O(log n) lookups."""
    if not keys or keys[0] not in held:
        return 0
    lo, hi = 1, len(keys)  # invariant: keys[lo-1] held; answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


def replicas_in(mask: int):
    """The replica indexes whose bits are set in a holders mask, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class PrefixIndex:
    def __init__(self, default_capacity_blocks: int | None = None) -> None:
        self.default_capacity = default_capacity_blocks
        self._holders: dict[Hashable, int] = {}
        self._lru: dict[int, OrderedDict] = {}
        self._cap: dict[int, int | None] = {}

    def set_capacity(self, replica: int, blocks: int | None) -> None:
        if self._cap.get(replica, self.default_capacity) != blocks:
            self._cap[replica] = blocks
            self._evict(replica)

    def _od(self, replica: int) -> OrderedDict:
        od = self._lru.get(replica)
        if od is None:
            od = self._lru[replica] = OrderedDict()
        return od

    def insert(self, replica: int, keys: Sequence[Hashable]) -> None:
        od = self._od(replica)
        holders = self._holders
        bit = 1 << replica
        touch = od.move_to_end
        for k in reversed(keys):
            if k in od:
                touch(k)
            else:
                od[k] = None
                holders[k] = holders.get(k, 0) | bit
        self._evict(replica)

    def _evict(self, replica: int) -> None:
        cap = self._cap.get(replica, self.default_capacity)
        od = self._lru.get(replica)
        if cap is None or od is None:
            return
        while len(od) > cap:
            k, _ = od.popitem(last=False)
            self._drop_holder(k, replica)

    def _drop_holder(self, k: Hashable, replica: int) -> None:
        h = self._holders.get(k, 0) & ~(1 << replica)
        if h:
            self._holders[k] = h
        else:
            self._holders.pop(k, None)

    def remove(self, replica: int, keys: Iterable[Hashable]) -> None:
        od = self._lru.get(replica)
        if od is None:
            return
        for k in keys:
            if od.pop(k, 0) is None:
                self._drop_holder(k, replica)

    def clear(self, replica: int) -> None:
        od = self._lru.pop(replica, None)
        for k in od or ():
            self._drop_holder(k, replica)

    def match_len(self, replica: int, keys: Sequence[Hashable]) -> int:
        od = self._lru.get(replica)
        if not od:
            return 0
        return held_prefix_len(keys, od)

    def apply_event(self, replica: int, event) -> None:
        """A replica's KV event (``anchorage.routing.events``): ``BlockStored`` adds its
        keys, ``BlockRemoved`` drops them, ``AllBlocksCleared`` empties the replica."""
        from anchorage.routing.events import GPU, AllBlocksCleared, BlockRemoved, BlockStored

        if getattr(event, "medium", GPU) != GPU:
            return  # a host tier's event: not this (device) index's
        if isinstance(event, BlockStored):
            self.insert(replica, list(event.keys))
        elif isinstance(event, BlockRemoved):
            self.remove(replica, event.keys)
        elif isinstance(event, AllBlocksCleared):
            self.clear(replica)
        else:
            raise TypeError(f"unknown KV event {type(event).__name__}")

    def match(self, keys: Sequence[Hashable]) -> dict[int, int]:
        if not keys:
            return {}
        out = {}
        for r in replicas_in(self._holders.get(keys[0], 0)):
            out[r] = self.match_len(r, keys)
        return out

    def size(self, replica: int) -> int:
        od = self._lru.get(replica)
        return len(od) if od else 0

    def replicas(self) -> list[int]:
        return list(self._lru)


class TieredPrefixIndex:
    """A device ``PrefixIndex`` and one per lower medium (module specification)."""

    def __init__(self, media: Sequence[str] = ("CPU",)) -> None:
        self.device = PrefixIndex(None)
        self.lower = {m: PrefixIndex(None) for m in media}

    def apply_event(self, replica: int, event) -> None:
        from anchorage.routing.events import GPU, AllBlocksCleared

        if isinstance(event, AllBlocksCleared):  # vLLM's reset_prefix_cache: the device
            self.device.clear(replica)
            return
        medium = getattr(event, "medium", GPU)
        if medium == GPU:
            self.device.apply_event(replica, event)
        elif medium in self.lower:
            idx = self.lower[medium]
            from anchorage.routing.events import BlockStored

            if isinstance(event, BlockStored):
                idx.insert(replica, list(event.keys))
            else:
                idx.remove(replica, event.keys)

    def clear(self, replica: int) -> None:
        self.device.clear(replica)
        for idx in self.lower.values():
            idx.clear(replica)

    def tier_runs(self, replica: int, keys: Sequence[Hashable]) -> tuple[int, int]:
        d = self.device.match_len(replica, keys)
        lowers = [od for od in (i._lru.get(replica) for i in self.lower.values()) if od]
        if not lowers:
            return d, 0
        dev = self.device._lru.get(replica) or {}
        n = d
        for k in keys[d:]:
            if k in dev or any(k in od for od in lowers):
                n += 1
            else:
                break
        return d, n - d

    def match_tiers(self, keys: Sequence[Hashable]) -> dict[int, tuple[int, int]]:
        if not keys:
            return {}
        h = self.device._holders.get(keys[0], 0)
        for idx in self.lower.values():
            h |= idx._holders.get(keys[0], 0)
        return {r: self.tier_runs(r, keys) for r in replicas_in(h)}

    def match_len(self, replica: int, keys: Sequence[Hashable]) -> int:
        """Leading keys held in some tier (the prefix the engine need not recompute)."""
        d, lo = self.tier_runs(replica, keys)
        return d + lo

    def size(self, replica: int) -> int:
        return self.device.size(replica)
