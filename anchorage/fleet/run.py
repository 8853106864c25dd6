"""One stack on one workload at one load, in the timed simulator; the fleet's metrics.

Specification
-------------
``run_stack(spec, records, contexts, setting)``: the replicas of ``setting`` (profile,
replicas, closed-loop session slots or an open-loop time scale, the memory hierarchy)
configured as ``spec`` says, simulated once (``anchorage.tiering.sim.simulate_tiered``).
A ``limit = "infinite-device"`` stack gets HBM for every block the workload ever caches
(``workload_blocks``); ``"infinite-host"`` a host tier without bound; ``"free-tiers"`` that
tier behind a link without cost (``MemoryHierarchy.free_reload``).

Metrics (``fleet_metrics``) over the steady-state window of the closed loop (``lo, hi``:
the cluster's ``measured_requests``; the open loop: the measured requests' span), per
GPU = per ``replicas x profile.devices``:

- ``turns_per_s_per_gpu``: turns completed inside the window per second per GPU;
- ``goodput_per_gpu``: the same, counting only turns whose TTFT is at most ``slo_s``;
- ``sessions_per_gpu_hour``: sessions whose last turn completed inside the window, per
  GPU-hour;
- ``ttft_p50_s`` / ``ttft_p90_s`` / ``ttft_p99_s`` (the cluster's report), ``slo_attainment``
  (share of measured turns within the SLO);
- ``session_time_mean_s`` (first arrival to last completion, tool gaps included) and
  ``session_service_mean_s`` (CacheWise's session completion time: the sum of its turns'
  latencies, tool gaps excluded), over sessions whose turns all completed;
- ``gpu_hit_rate`` / ``host_hit_rate`` (block-weighted, of the measured prompts),
  ``host_link_bytes`` (both directions) and ``host_link_bytes_per_turn``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from anchorage.fleet.hierarchy import MemoryHierarchy
from anchorage.fleet.spec import StackSpec
from anchorage.percentile import percentile
from anchorage.sim.cluster import TimedConfig, measured_requests
from anchorage.sim.profiles import HardwareProfile
from anchorage.tiering.host_tier import block_bytes
from anchorage.tiering.params import TieringConfig
from anchorage.tiering.sim import simulate_tiered
from anchorage.tiering.temporal import GateParams


@dataclass(frozen=True)
class Setting:
    profile: HardwareProfile
    replicas: int
    slots: int | None = None           # closed loop: concurrent sessions
    time_scale: float = 1.0            # open loop: multiplies trace timestamps
    mode: str = "closed"
    warmup_frac: float = 0.2
    think_s: float = 0.3
    slo_s: float = 2.0
    hierarchy: MemoryHierarchy = field(default_factory=MemoryHierarchy)

    @property
    def gpus(self) -> int:
        return self.replicas * self.profile.devices


def workload_blocks(contexts: Sequence, block_size: int) -> int:
    """Blocks that caching every prompt and output of the workload at once needs."""
    keys = set()
    out = 0
    for c in contexts:
        keys.update(c.keys)
        out += -(-max(1, c.output_length) // block_size) + 1
    return len(keys) + out + 64


def _timed_config(spec: StackSpec, st: Setting, contexts) -> TimedConfig:
    cap = None
    if spec.limit == "infinite-device":  # the pooled router: one pool of replicas x cap
        need = workload_blocks(contexts, st.profile.block_size)
        cap = max(st.profile.capacity_blocks, -(-need // st.replicas))
    return TimedConfig(
        st.profile, replicas=st.replicas, mode=st.mode, time_scale=st.time_scale,
        think_s=st.think_s, max_sessions=st.slots if st.mode == "closed" else None,
        warmup_frac=st.warmup_frac if st.mode == "closed" else 0.0, capacity_blocks=cap,
        admission=spec.admission, admission_params=spec.admission_kwargs(st.slo_s) or None,
        long_prefill_tokens=spec.long_prefill_tokens,
        program_gate=spec.program_gate,
        program_gate_params=dict(spec.program_gate_params) or None,
        retention=spec.retention, retention_params=dict(spec.retention_params) or None)


def _tiering_config(spec: StackSpec, st: Setting) -> TieringConfig:
    hier = st.hierarchy
    if spec.limit in ("infinite-host", "free-tiers"):
        from dataclasses import replace
        hier = replace(hier, infinite_host=True, free_reload=spec.limit == "free-tiers")
    return TieringConfig(mode=spec.tiering, host=hier.host_config(st.profile),
                         gate=GateParams(**spec.gate), **spec.tiering_params)


def run_stack(spec: StackSpec, records, contexts, setting: Setting, *,
              policy_params: dict | None = None) -> dict[str, Any]:
    st = setting
    cfg = _timed_config(spec, st, contexts)
    params = dict(spec.policy_params)
    params.update(policy_params or {})
    tiering = _tiering_config(spec, st)
    host_blocks = (tiering.host.capacity_blocks(block_bytes(st.profile.model, st.profile.block_size))
                   if spec.has_host_tier else None)
    c0 = time.process_time()
    sim, out = simulate_tiered(
        records, contexts, cfg, spec.policy, spec.router, tiering=tiering,
        policy_params=params or None,
        router_params=spec.router_kwargs(st.profile.block_size, host_blocks) or None,
        replicas_per_link=st.hierarchy.replicas_per_link(st.profile))
    res = fleet_metrics(sim, out, st)
    res["cpu_s"] = time.process_time() - c0
    if sim.gate is not None:
        res["program_gate"] = sim.gate.counters()
    pins = [r.retention for r in sim.replicas if r.retention is not None]
    if pins:
        res["pins"] = sum(p.pinned for p in pins)
    return res


def fleet_metrics(sim, out: dict, st: Setting) -> dict[str, Any]:
    done, window = measured_requests(sim)
    gpus = st.gpus
    if window is None:
        lo = min((r.arrival_s for r in done), default=0.0)
        hi = max((r.finish_s for r in done), default=0.0)
    else:
        lo, hi = window
    span = max(hi - lo, 1e-9)
    slo = st.slo_s
    in_window = [r for r in sim.completed if lo <= r.finish_s <= hi]
    good = sum(1 for r in in_window if r.first_token_s - r.arrival_s <= slo)
    ttft = [r.first_token_s - r.arrival_s for r in done]
    last_turn = {}
    turns: dict[Any, list] = {}
    for r in sim.completed:
        if r.session is not None:
            turns.setdefault(r.session, []).append(r)
            if r.finish_s >= last_turn.get(r.session, -1.0):
                last_turn[r.session] = r.finish_s
    following = getattr(sim, "_following", {})
    ended = [r for r in sim.completed
             if r.session is not None and r.index not in following and lo <= r.finish_s <= hi]
    complete = [rs for rs in turns.values()
                if any(r.index not in following for r in rs) and rs[0].measured]
    svc = [sum(r.finish_s - r.arrival_s for r in rs) for rs in complete]
    wall = [max(r.finish_s for r in rs) - min(r.arrival_s for r in rs) for rs in complete]
    n_turns = len(in_window)
    moved = out.get("bytes_moved", 0)
    return {
        "turns_per_s_per_gpu": n_turns / span / gpus,
        "goodput_per_gpu": good / span / gpus,
        "slo_attainment": (sum(1 for x in ttft if x <= slo) / len(ttft)) if ttft else 0.0,
        "sessions_per_gpu_hour": len(ended) / span * 3600.0 / gpus,
        "ttft_p50_s": out["ttft_p50_s"], "ttft_p90_s": out["ttft_p90_s"],
        "ttft_p99_s": out["ttft_p99_s"], "ttft_mean_s": out["ttft_mean_s"],
        "session_time_mean_s": sum(wall) / len(wall) if wall else None,
        "session_service_mean_s": sum(svc) / len(svc) if svc else None,
        "session_service_p90_s": percentile(svc, 90) if svc else None,
        "gpu_hit_rate": out["hit_rate"], "host_hit_rate": out.get("host_hit_rate", 0.0),
        "host_link_bytes": moved, "offload_bytes": out.get("offload_bytes", 0),
        "reload_bytes": out.get("reload_bytes", 0),
        "host_link_bytes_per_turn": moved / max(1, out["measured_requests"]),
        "preemptions": out["preemptions"], "evictions": out["evictions"],
        "measured_requests": out["measured_requests"], "rejected": out["rejected"],
        "window_s": [lo, hi], "makespan_s": out["makespan_s"], "gpus": gpus,
        "recomputed_tokens": out["recomputed_tokens"],
    }
