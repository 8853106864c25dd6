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
  failed: ``hold_back``); a chunk freed (evicted, a failed store) or a reset is retracted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from anchorage.node_agent.offload.node_pool import PoolIndex
from anchorage.node_agent.offload.worker import NodeLoadStoreSpec


class NodePoolManager(CPUOffloadingManager):
    def __init__(self, index: PoolIndex, **kwargs) -> None:
        super().__init__(**kwargs)
        self.index = index
        self._from_peers: Counter = Counter()  # keys of peer loads in flight
        self._bad: set[int] = set()            # chunks whose store failed: never published
        self.pool_counts = index.counts

    def _own(self, key: OffloadKey):
        return self._policy.get(key)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
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
        super().touch([k for k in keys if self._own(k) is not None], req_context)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext):
        keep = []
        for k in keys:
            if self._own(k) is None and self.index.find(k) is not None:
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
        for k, chunk in pending.items():
            c = self._own(k)
            if c is not None and c.is_ready and c.chunk_id == chunk and chunk not in self._bad:
                self.index.publish(chunk, k)

    def _free_chunk(self, chunk) -> None:
        self.index.retract(chunk.chunk_id)
        self._bad.discard(chunk.chunk_id)
        super()._free_chunk(chunk)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.index.retract_all()
        self._bad.clear()

    def shutdown(self) -> None:
        self.index.close()
        super().shutdown()
