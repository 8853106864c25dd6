"""``AnchorageCachePolicy``: the host-tier policy of the core
(``anchorage.tiering.host_policy.HostPolicy``) as a vLLM 0.32 ``CachePolicy``, loaded out
of tree by ``eviction_policy: AnchorageCachePolicy`` and ``cache_policy_module_path:
anchorage.node_agent.offload.policy`` in ``kv_connector_extra_config``.

It is vLLM's own ``LRUCachePolicy`` until Anchorage's connector
(``anchorage.node_agent.offload.connector``) binds the engine's session predictions
(``bind``, before any chunk is stored): without that connector, or with it disabled
(``anchorage.enabled: false``, or the Anchorage plugin off), the host tier is exactly
vLLM's LRU. Bound, every call goes to the core policy, with the request id of the access
(``ReqContext.req_id``; an insert takes the id of the store that precedes it, vLLM's
``on_store_miss``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from anchorage.tiering.host_policy import HostPolicy
from anchorage.tiering.returns import SessionReturns


class AnchorageCachePolicy(CachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.stock: LRUCachePolicy | None = LRUCachePolicy(cache_capacity)
        self.core: HostPolicy | None = None
        self._rid: Any = None
        self.demoted = 0

    @property
    def name(self) -> str:
        return "anchorage" if self.core is not None else "lru"

    def bind(self, returns: SessionReturns, clock: Callable[[], float]) -> bool:
        """Use the core policy with ``returns``' predictions from now on. Refused (False)
        once vLLM's LRU holds chunks (the order would not carry over)."""
        if self.stock is not None and self.stock.chunks:
            return False
        self.core = HostPolicy(self.cache_capacity, returns, clock=clock)
        self.stock = None
        return True

    def _impl(self):
        return self.stock if self.stock is not None else self.core

    @property
    def chunks(self) -> dict:
        return self.stock.chunks if self.stock is not None else self.core.chunks

    def demote(self, chunk_ids: Iterable[int]) -> int:
        """Chunks whose host copy is bad (a failed store) go first: their keys become
        anonymous and least recent. Returns how many were found."""
        if self.core is None:
            return 0
        ids = set(chunk_ids)
        found = [k for k, c in self.core.chunks.items() if c.chunk_id in ids]
        for k in found:
            self.core.last[k] = float("-inf")
            self.core.ia.pop(k, None)
        self.demoted += len(found)
        return len(found)

    # -- CachePolicy ----------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self._impl().get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        if self.stock is not None:
            self.stock.insert(key, chunk)
        else:
            self.core.insert(key, chunk, self._rid)

    def remove(self, key: OffloadKey) -> None:
        self._impl().remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        if self.stock is not None:
            self.stock.touch(keys, req_context)
        else:
            self.core.touch(keys, req_context.req_id)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        if self.stock is not None:
            self.stock.on_store_miss(keys, req_context)
        else:
            self._rid = req_context.req_id
            self.core.on_store_miss(keys, req_context.req_id)

    def on_request_finished(self, key_groups: Sequence[Sequence[OffloadKey]],
                            insertion_only_keys: set[OffloadKey],
                            reused_keys: set[OffloadKey], req_context: ReqContext) -> None:
        if self.stock is not None:
            self.stock.on_request_finished(key_groups, insertion_only_keys, reused_keys,
                                           req_context)
        else:
            self.core.on_request_finished(key_groups, insertion_only_keys, reused_keys,
                                          req_context.req_id)

    def evict(self, n: int, protected: set[OffloadKey]
              ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        return self._impl().evict(n, protected)

    def clear(self) -> None:
        self._impl().clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self._impl().mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._impl().mark_non_evictable(key)
