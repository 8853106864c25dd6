"""The memory hierarchy of a serving node: HBM per replica, host DRAM per GPU, host links.

Specification
-------------
A node has ``gpus_per_node`` GPUs (default 8: an HGX/DGX H200) and ``host_bytes_per_gpu``
of host DRAM per GPU for KV (default 256 GB: a 2 TB node split over 8 GPUs; the engines'
CPU caches, vLLM's ``OffloadingConnector`` ``cpu_bytes_to_use``, LMCache's local CPU
backend and Dynamo KVBM's host pool, are each allocated per engine, so a replica of ``g``
GPUs owns ``g`` shares). HBM: the profile's KV budget as vLLM sizes it
(``HardwareProfile.capacity_blocks``).

Host link: each H200 SXM reaches host memory over PCIe Gen5 x16: 32 GT/s x 16 lanes with
128b/130b encoding = 63 GB/s per direction; large pinned copies reach about 80 % of it
(NVIDIA's ``nvbandwidth`` reports about 55 GB/s host-to-device and device-to-host on
Hopper SXM systems). ``link_gbs_per_gpu`` (default 50) is that effective rate, each way,
an assumption of this model (a calibration file's measured ``host_*_bytes_s`` replace it
when the profile has them). ``gpus_per_link`` GPUs share one link (default 1: each GPU
its own x16; 2 models PCIe switches whose uplink two GPUs share; ``gpus_per_node``: one
link for the whole node). A replica of ``g`` GPUs copies its KV shards over its GPUs'
links in parallel: ``g`` links' bandwidth when ``g >= gpus_per_link``; replicas behind
one shared link queue on it (``replicas_per_link``).

``host_config(profile)``: the replica's ``HostTierConfig``; ``replicas_per_link(profile)``.
``infinite_host``: a host tier without a capacity bound (the limit row). ``free_reload``:
besides, a link without cost (no bandwidth bound, no latency): whatever the HBM evicts is
back the moment it is asked for (the tiers' limit row: no eviction order, tier policy or
prefetch can do better with this HBM; admission and scheduling still can).
"""

from __future__ import annotations

from dataclasses import dataclass

from anchorage.tiering.host_tier import GB, HostTierConfig

PCIE_GEN5_X16_GBS = 32 * 16 * 128 / 130 / 8  # 63.0 GB/s each way, signalling rate


@dataclass(frozen=True)
class MemoryHierarchy:
    host_bytes_per_gpu: float = 256 * GB
    link_gbs_per_gpu: float = 50.0
    gpus_per_link: int = 1
    gpus_per_node: int = 8
    link_latency_s: float = 50e-6
    infinite_host: bool = False
    free_reload: bool = False

    def __post_init__(self) -> None:
        if self.host_bytes_per_gpu < 0 or self.link_gbs_per_gpu <= 0:
            raise ValueError("host_bytes_per_gpu must be >= 0 and link_gbs_per_gpu > 0")
        if self.gpus_per_link < 1 or self.gpus_per_node < 1 or self.link_latency_s < 0:
            raise ValueError("gpus_per_link and gpus_per_node must be >= 1, latency >= 0")
        if self.gpus_per_node % self.gpus_per_link:
            raise ValueError("gpus_per_link must divide gpus_per_node")

    def replicas_per_node(self, profile) -> int:
        return max(1, self.gpus_per_node // profile.devices)

    def replicas_per_link(self, profile) -> int:
        return max(1, self.gpus_per_link // profile.devices)

    def link_bytes_s(self, profile) -> float:
        links = max(1, profile.devices // self.gpus_per_link)
        return links * self.link_gbs_per_gpu * GB

    def host_config(self, profile) -> HostTierConfig:
        if self.free_reload:
            return HostTierConfig.for_profile(profile, capacity_bytes=1e18, d2h_bytes_s=1e18,
                                              h2d_bytes_s=1e18, latency_s=0.0)
        cap = 1e18 if self.infinite_host else self.host_bytes_per_gpu * profile.devices
        bw = None if profile.host_d2h_bytes_s is not None else self.link_bytes_s(profile)
        return HostTierConfig.for_profile(profile, capacity_bytes=cap, d2h_bytes_s=bw,
                                          h2d_bytes_s=bw, latency_s=self.link_latency_s)

    def describe(self, profile) -> dict:
        return {"gpus_per_node": self.gpus_per_node,
                "host_bytes_per_replica": None if self.infinite_host or self.free_reload
                else self.host_bytes_per_gpu * profile.devices,
                "link_bytes_s_per_replica_each_way": self.link_bytes_s(profile),
                "replicas_per_link": self.replicas_per_link(profile),
                "pcie_gen5_x16_signalling_gbs": PCIE_GEN5_X16_GBS,
                "hbm_kv_blocks_per_replica": profile.capacity_blocks,
                "block_size": profile.block_size}
