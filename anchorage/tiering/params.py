"""The tiering parameters, one typed source for the simulator and the engine.

Specification
-------------
``TemporalParams`` (the temporal controller's, ``anchorage.tiering.controller``; the
engine uses it as is, the simulator through ``TieringConfig``, which extends it):

- the idle-time settings of ``anchorage.tiering.forecast.IdleEstimate`` (``default_stall_s``
  1 s, ``queue_wait`` True, ``wait_ewma`` 0.2);
- ``host``: ``anchorage.tiering.host_tier.HostTierConfig`` (host memory budget, link
  bandwidth each way, latency per transfer; defaults 100 GB, 25 GB/s, 50 us);
- ``gate``: ``anchorage.tiering.temporal.GateParams`` (the gate, holds, backups, reload lead);
- ``horizon_s`` (default 600 s): a stall older than this is dropped, the session did not come
  back (its host room is released);
- ``max_sessions`` (default 4096): open stalls and churn marks kept, the oldest dropped first;
- ``max_waiting_scan`` (default 32): how many queued requests the gate's fit test and the
  pressure read (the engine's prefix-aware scheduler reports as many).

``TieringConfig`` (the simulator's, ``anchorage.tiering.sim.run_tiered``): ``TemporalParams``
plus ``mode`` (``MODES``; default ``tokencake``), ``spatial`` / ``weights``
(``anchorage.tiering.spatial``) and ``spatial_interval_s`` (0.5 s). Its ``horizon_s`` and
``max_sessions`` default to unbounded: the simulator keeps every session's stall until the
session comes back. For ``mode="offload"`` (vLLM's offloading connector,
``anchorage.tiering.sim_offload``): ``host_policy`` (``HOST_POLICIES``, default ``lru``:
what host memory keeps) and ``reload_ahead`` (default False: the temporal gate protecting a
stalled session's host copy and the just-in-time reload; with ``anchorage`` or
``oracle`` only). ``host_scope`` (``HOST_SCOPES``): ``replica`` (default: each replica's
host tier is its own), ``node`` (each replica's tier is its own and read by the node's
other replicas, one copy per node: ``anchorage.tiering.host_tier.share_hosts``), ``node-lru``
(the same with the node's capacity and LRU order over the tiers: the engine's node pool,
``host_tier.lru_hosts``) or ``pooled``
(one allocator over the node's host memory: ``host_tier.pool_hosts``, a reference); the
scopes other than ``replica`` need a mode other than ``offload``. ``sync_load_max_s``
(default ``anchorage.tiering.loads.SYNC_LOAD_MAX_S``, 0; >= 0, ``inf`` allowed): a host
load the replica waits for in the step that admits its request, as the engine's host tier
does (``anchorage.tiering.loads.sync_load`` over the load's transfer time); 0 is vLLM's
offloading connector (every load between steps), ``inf`` LMCache's (every load in the step).

``TemporalParams.from_env(env)``: the engine's configuration (``ANCHORAGE_HOST_BYTES``,
required, > 0: the host budget in bytes, the offload connector's ``cpu_bytes_to_use``;
``ANCHORAGE_HOST_LINK_GBS``, default 25: GB/s each way; ``ANCHORAGE_TEMPORAL_WATERMARK``,
default 0.5: the gate's pressure watermark); a bad value is a ValueError naming the
variable. Every class here is a frozen dataclass: an unknown name is a TypeError, a value
out of range a ValueError naming it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from anchorage.tiering import spatial as sp
from anchorage.tiering.forecast import IdleEstimate
from anchorage.tiering.host_tier import GB, HostTierConfig
from anchorage.tiering.loads import SYNC_LOAD_MAX_S
from anchorage.tiering.temporal import GateParams

ENV_HOST_BYTES = "ANCHORAGE_HOST_BYTES"
ENV_LINK_GBS = "ANCHORAGE_HOST_LINK_GBS"
ENV_WATERMARK = "ANCHORAGE_TEMPORAL_WATERMARK"
MODES = ("off", "naive", "naive-incremental", "store-all", "temporal", "tokencake", "offload")
HOST_POLICIES = ("lru", "arc", "anchorage", "oracle")
HOST_SCOPES = ("replica", "node", "node-lru", "pooled")
UNBOUNDED = 1 << 62


@dataclass(frozen=True, kw_only=True)
class TemporalParams(IdleEstimate):
    host: HostTierConfig = field(default_factory=HostTierConfig)
    gate: GateParams = field(default_factory=GateParams)
    horizon_s: float = 600.0
    max_sessions: int = 4096
    max_waiting_scan: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {self.horizon_s!r}")
        if self.max_sessions < 1 or self.max_waiting_scan < 0:
            raise ValueError("max_sessions must be >= 1 and max_waiting_scan >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TemporalParams:
        env = os.environ if env is None else env

        def num(name: str, default: float | None) -> float:
            raw = (env.get(name) or "").strip()
            if not raw:
                if default is None:
                    raise ValueError(f"ANCHORAGE_TIERING=temporal needs {name} (the host "
                                     f"memory budget in bytes, the connector's cpu_bytes_to_use)")
                return default
            try:
                v = float(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {raw!r}") from None
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {raw!r}")
            return v

        host = num(ENV_HOST_BYTES, None)
        if host <= 0:
            raise ValueError(f"{ENV_HOST_BYTES} must be > 0, got {host:g}")
        gbs = num(ENV_LINK_GBS, 25.0)
        if gbs <= 0:
            raise ValueError(f"{ENV_LINK_GBS} must be > 0, got {gbs:g}")
        wm = num(ENV_WATERMARK, 0.5)
        if wm > 1:
            raise ValueError(f"{ENV_WATERMARK} must be in [0, 1], got {wm:g}")
        link = gbs * GB
        return cls(host=HostTierConfig(capacity_bytes=int(host), d2h_bytes_s=link,
                                       h2d_bytes_s=link),
                   gate=GateParams(watermark=wm))


@dataclass(frozen=True, kw_only=True)
class TieringConfig(TemporalParams):
    mode: str = "tokencake"
    spatial: sp.SpatialParams = field(default_factory=sp.SpatialParams)
    weights: sp.ScoreWeights = field(default_factory=sp.ScoreWeights)
    spatial_interval_s: float = 0.5
    horizon_s: float = math.inf
    max_sessions: int = UNBOUNDED
    host_policy: str = "lru"
    reload_ahead: bool = False
    host_scope: str = "replica"
    sync_load_max_s: float = SYNC_LOAD_MAX_S

    def __post_init__(self) -> None:
        super().__post_init__()
        if math.isnan(self.sync_load_max_s) or self.sync_load_max_s < 0:
            raise ValueError(f"sync_load_max_s must be >= 0 (seconds; inf: every load), got "
                             f"{self.sync_load_max_s!r}")
        if self.mode not in MODES:
            raise ValueError(f"tiering mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.host_scope not in HOST_SCOPES:
            raise ValueError(f"host_scope must be one of {', '.join(HOST_SCOPES)}, got "
                             f"{self.host_scope!r}")
        if self.host_scope != "replica" and self.mode == "offload":
            raise ValueError(f"host_scope {self.host_scope!r} needs a tiering mode other than "
                             "'offload'")
        if self.host_policy not in HOST_POLICIES:
            raise ValueError(f"host_policy must be one of {', '.join(HOST_POLICIES)}, got "
                             f"{self.host_policy!r}")
        if not self.spatial_interval_s > 0:
            raise ValueError("spatial_interval_s must be > 0")
