"""``NodePoolManager``: vLLM's ``CPUOffloadingManager`` (this engine's host tier, its policy,
stores and evictions unchanged) that publishes its chunks to the node pool and serves
lookups its own tier misses from the node's other engines
(``anchorage.node_agent.offload.node_pool``, whose specification this follows).

- ``lookup``: this tier first; a miss that a peer holds readable is a ``HIT``.
- ``prepare_load``: this tier's chunks as vLLM's manager prepares them (reference counted);
  a peer's chunk by (peer, chunk, version seen) in a ``NodeLoadStoreSpec``, never reference
  counted (the worker checks its version instead); a chunk the peer dropped since the lookup
  gets an odd version, so its load fails and is recomputed.
- ``complete_load`` / ``touch``: this tier's chunks only (loads from peers are counted, so
  the reference counts of this tier stay exact whatever order loads complete in).
- ``prepare_store``: keys a peer holds readable are not stored (one copy per node).
- ``complete_store``: each chunk stored is published (unless the worker reported its store
  failed: ``hold_back``); a chunk freed (evicted, a failed store) or a reset is retracted,
  and its pages are given back (``PoolIndex.punch``).
- The node's capacity and order (the node-wide LRU; the simulator's ``host_scope =
  "node-lru"``): this engine's share is its own capacity (``share`` chunks), its chunk pool
  ``num_chunks`` slots (``node_pool_growth`` times the share); it may hold more than its share while
  the node holds less than the sum of the shares (``_get_num_free_chunks``: free slots, at
  most the node's free chunks; past that a store evicts this engine's own). A shadow LRU
  order of this engine's ready chunks stamps every use (a store completing, a load, a touch,
  a peer's use published in the index's read stamps); at most every ``refresh_s`` it
  publishes its chunk count and its tail's stamp, refreshes in its policy the chunks peers
  used, and, while the node holds more than its capacity less ``HEADROOM`` of it and its
  tail is the node's oldest, evicts its own least recently used chunks (its policy's
  order) down to that. A load from a peer and a store skipped because a peer holds the
  block stamp the peer's chunk.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from anchorage.node_agent.offload.node_pool import PoolIndex, log
from anchorage.node_agent.offload.worker import NodeLoadStoreSpec

HEADROOM = 1 / 64   # of the node's capacity, kept free by the owner of the oldest tail
_BALANCE = ReqContext(req_id="anchorage-node-pool")


class NodePoolManager(CPUOffloadingManager):
    def __init__(self, index: PoolIndex, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index
        self._from_peers: Counter = Counter()  # keys of peer loads in flight
        self._bad: set[int] = set()            # chunks whose store failed: never published
        self.pool_counts = index.counts
        self._order: OrderedDict[int, float] = OrderedDict()  # ready chunk -> last use
        self._key_of: dict[int, OffloadKey] = {}
        self._next_balance = 0.0

    # -- the node's capacity and order ------------------------------------------------

    def _used(self) -> int:
        return self._num_allocated_chunks - len(self._free_list)

    def _use(self, chunk_id: int) -> None:
        if chunk_id in self._order:
            self._order[chunk_id] = self.index.clock()
            self._order.move_to_end(chunk_id)

    def _tail(self) -> float:
        return next(iter(self._order.values())) if self._order else float("inf")

    def balance(self, force: bool = False) -> None:
        """Publish, refresh what peers used, and make room if this engine holds the node's
        oldest chunks (module specification). Any failure: logged by the index, skipped."""
        now = self.index.clock()
        if now < self._next_balance and not force:
            return
        self._next_balance = now + self.index.refresh_s
        try:
            self.index.refresh(force=force)
            used = [self._key_of[c] for c in self.index.reads_since() if c in self._key_of]
            if used:
                self.touch(used, _BALANCE)
            self.index.set_usage(self._used(), self._tail())
            budget, held, oldest = self.index.node()
            over = held - int(budget * (1 - HEADROOM))
            if over > 0 and self._order and self._tail() <= oldest:
                self._evict_own(min(over, self._num_evictable_cache_chunks))
                self.index.set_usage(self._used(), self._tail())
        except Exception:  # noqa: BLE001 - the serving path never breaks on the pool
            if not self.pool_counts["errors"]:
                log.warning("anchorage: node pool balance failed; skipped", exc_info=True)
            self.pool_counts["errors"] += 1

    def _evict_own(self, n: int) -> None:
        if n <= 0:
            return
        evicted = self._policy.evict(n, set())
        if not evicted:
            return
        self._num_evictable_cache_chunks -= len(evicted)
        for _, chunk in evicted:
            self._free_chunk(chunk)
        if self.events is not None:
            self.events.append(OffloadingEvent(keys=[k for k, _ in evicted],
                                               medium=self.medium, removed=True))

    def _get_num_free_chunks(self) -> int:
        free = super()._get_num_free_chunks()
        budget, held, _ = self.index.node()
        held += self._used() - int(self.index.usage[1])  # this engine's count as of now
        return max(0, min(free, budget - held))

    def _own(self, key: OffloadKey):
        return self._policy.get(key)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.balance()
        res = super().lookup(key, req_context)
        if res is not LookupResult.MISS:
            return res
        return LookupResult.HIT if self.index.find(key) is not None else LookupResult.MISS

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext):
        keys = list(keys)
        own_keys, where = [], []
        for k in keys:
            c = self._own(k)
            if c is not None and c.is_ready:
                own_keys.append(k)
                where.append(None)
            else:
                where.append(self.index.find(k) or ("", 0, 1))  # gone: the load fails
        own = self._prepare_load(own_keys, req_context, record_access=True).block_ids
        for c in own:
            self._use(int(c))
        peers: dict[str, int] = {}
        ids, owners, versions = [], [], []
        i = 0
        for k, w in zip(keys, where):
            if w is None:
                ids.append(int(own[i]))
                owners.append(-1)
                versions.append(0)
                i += 1
                continue
            eid, chunk, version = w
            self.index.stamp_read(eid, chunk)
            ids.append(chunk)
            owners.append(peers.setdefault(eid, len(peers)))
            versions.append(version)
            self._from_peers[k] += 1
        self.pool_counts["peer_hits"] += len(keys) - len(own_keys)
        return NodeLoadStoreSpec(ids, owners, versions, list(peers))

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        own = []
        for k in keys:
            if self._from_peers.get(k, 0) > 0:
                self._from_peers[k] -= 1
                if not self._from_peers[k]:
                    del self._from_peers[k]
            else:
                own.append(k)
        super().complete_load(own, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        own = []
        for k in keys:
            c = self._own(k)
            if c is not None:
                own.append(k)
                self._use(c.chunk_id)
        super().touch(own, req_context)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext):
        self.balance()
        keep = []
        for k in keys:
            if self._own(k) is None and (w := self.index.find(k)) is not None:
                self.index.stamp_read(w[0], w[1])   # a use of the peer's copy
                self.pool_counts["deduplicated"] += 1
                continue
            keep.append(k)
        return super().prepare_store(keep, req_context)

    def hold_back(self, chunks: Iterable[int]) -> None:
        """Chunks whose store failed (the worker's report): not published."""
        for c in chunks:
            self._bad.add(int(c))
            self.index.retract(int(c))

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        pending = {k: c.chunk_id for k in keys if (c := self._own(k)) is not None
                   and not c.is_ready} if success else {}
        super().complete_store(keys, req_context, success)
        now = self.index.clock()
        for k, chunk in pending.items():
            c = self._own(k)
            if c is not None and c.is_ready and c.chunk_id == chunk and chunk not in self._bad:
                self.index.publish(chunk, k)
                self._order[chunk] = now
                self._order.move_to_end(chunk)
                self._key_of[chunk] = k

    def _free_chunk(self, chunk) -> None:
        c = chunk.chunk_id
        self.index.retract(c)   # first: a peer copying it fails its version check
        self.index.punch(c)     # then its pages go, before the slot is written again
        self._bad.discard(c)
        self._order.pop(c, None)
        self._key_of.pop(c, None)
        super()._free_chunk(chunk)

    def reset_cache(self) -> None:
        held = list(self._order)
        super().reset_cache()
        self.index.retract_all()
        for c in held:
            self.index.punch(c)
        self._bad.clear()
        self._order.clear()
        self._key_of.clear()

    def shutdown(self) -> None:
        self.index.close()
        super().shutdown()
