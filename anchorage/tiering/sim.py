"""Timed simulation with a host tier: ``run_tiered``, and the tiering modes.

Specification
-------------
Modes (``TieringConfig.mode``, ``anchorage.tiering.params``): ``off`` (no host tier:
``anchorage.sim.cluster.run_timed``), ``naive`` (the paper's plain offload: every turn that
ends in a tool call swaps the session's whole context out, all its GPU blocks copied
whatever host memory holds, and back in when the tool returns), ``naive-incremental`` (the
same, copying only blocks host memory lacks), ``store-all`` (every turn's new blocks
copied out, whatever stopped it; reloaded at admission only: vLLM's CPU offloading
connector, LMCache, Dynamo's KVBM), ``temporal`` (the temporal controller,
``anchorage.tiering.controller``: the gate, holds, backups and warm-up reloads,
criticality 0), ``tokencake`` (temporal plus the spatial policy of
``anchorage.tiering.spatial``) and ``offload`` (vLLM's offloading connector: write-through
stores, loads at admission, ``host_policy`` choosing what host memory keeps,
``reload_ahead`` the temporal gate and just-in-time reloads;
``anchorage.tiering.sim_offload``). Every replica gets a ``SimTiering``
(``anchorage.tiering.replica``) and the eviction wrapper ``TieredEviction`` around its
policy (``offload``: a ``SimOffload``, the policy unwrapped); the pooled router is refused
(tiering needs one pool per replica).

``TieringConfig.host_scope = "node"``: the replicas are one node's GPUs whose host tiers
read one another (``host_tier.share_hosts``; ``node-lru``: the same with the node's
capacity and LRU order, ``host_tier.lru_hosts``, the engine's node pool; ``pooled``: one key
table and capacity, ``host_tier.pool_hosts``), so a session that moves to another replica
reloads its history instead of recomputing it.

KV events: when the router consumes them (the replicas' pools are the cluster's
``EventPool``), each host tier publishes its stores and drops as ``medium="CPU"`` events on
its replica's event stream (``host_tier.HostTier.events``), as vLLM 0.32's offloading
connector does; device-only indexes ignore them, tier-aware ones
(``anchorage.routing.prefix_index.TieredPrefixIndex``) credit them.

Reported (``run_tiered``): everything ``run_timed`` reports plus ``tiering`` (mode and
parameters), ``host_hit_rate`` / ``host_hit_blocks`` / ``host_hit_tokens`` (prefix blocks
served from host memory, same requests as ``hit_rate``), ``offloads`` (copies out: offloads
and backups), ``offload_blocks``, ``reloads`` (warm-up and on demand), ``reload_blocks``,
``demand_reloads``, ``outcomes`` (``in_time``/``late``/``wasted``), ``offload_bytes``,
``reload_bytes``, ``bytes_moved``, ``gate`` (decisions by reason, plus the reload tests
``reload_low_saving`` / ``reload_no_room``), ``actions`` (``offload``, ``backup``,
``hold``, ``keep``: each gated stall once), ``demoted_evictions``, ``held_evictions``,
``protected_evictions``, ``reserved_blocks`` (mean and max per agent over spatial updates).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from anchorage.tiering.eviction import TieredEviction
from anchorage.tiering.host_tier import lru_hosts, pool_hosts, share_hosts
from anchorage.tiering.params import MODES, TieringConfig
from anchorage.tiering.replica import SimTiering, agent_of
from anchorage.tiering.sim_offload import SimOffload

__all__ = ["MODES", "SimTiering", "TieringConfig", "agent_of", "run_tiered", "simulate_tiered"]


def _merge(dicts: Sequence[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = dict(Counter(out.get(k, {})) + Counter(v))
            else:
                out[k] = out.get(k, 0) + v
    return out


def _reserved_blocks(ctl: Sequence[SimTiering]) -> dict[str, dict[str, float]]:
    """Mean (over all replicas' spatial updates) and max reserved blocks per agent."""
    spatial = [c.spatial for c in ctl if c.spatial is not None]
    n_upd = sum(s.updates for s in spatial)
    res_sum: Counter = Counter()
    res_max: Counter = Counter()
    for s in spatial:
        res_sum.update(s.reserved_sum)
        for a, v in s.reserved_max.items():
            res_max[a] = max(res_max[a], v)
    return {str(a): {"mean": res_sum[a] / n_upd if n_upd else 0.0,
            "max": res_max[a]} for a in res_sum}


def run_tiered(records, contexts, cfg, policy: str, router: str = "session", *,
               tiering: TieringConfig | None = None,
               policy_params: dict[str, Any] | None = None,
               router_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``run_timed`` with a host tier and a tiering mode on every replica."""
    return simulate_tiered(records, contexts, cfg, policy, router, tiering=tiering,
                           policy_params=policy_params, router_params=router_params)[1]


def simulate_tiered(records, contexts, cfg, policy: str, router: str = "session", *,
                    tiering: TieringConfig | None = None,
                    policy_params: dict[str, Any] | None = None,
                    router_params: dict[str, Any] | None = None,
                    replicas_per_link: int = 1, wrap_policy=None):
    """``run_tiered``, also returning the finished simulation (``(sim, report)``).
    Consecutive groups of ``replicas_per_link`` replicas share one host link (each
    direction one FIFO ``host_tier.Link``); ``wrap_policy`` wraps each replica's eviction
    policy (inside the tiering wrapper)."""
    from anchorage.sim.cluster import POOLED, measured_requests, simulate_timed
    from anchorage.tiering.host_tier import Link

    tiering = tiering or TieringConfig()
    if tiering.mode == "off":
        sim, out = simulate_timed(records, contexts, cfg, policy, router,
                                  policy_params=policy_params, router_params=router_params,
                                  wrap_policy=wrap_policy)
        out["tiering"] = {"mode": "off"}
        return sim, out
    if router == POOLED:
        raise ValueError("tiering needs one pool per replica (not the pooled router)")
    if replicas_per_link < 1:
        raise ValueError("replicas_per_link must be >= 1")
    tool_stop = [r.tool_name is not None or r.tool_duration_ms is not None for r in records]
    ctl: list = []
    offload = tiering.mode == "offload"
    h = tiering.host

    def attach(sim) -> None:
        links = None
        for i, rep in enumerate(sim.replicas):
            if i % replicas_per_link == 0:
                links = (Link(h.d2h_bytes_s, h.latency_s), Link(h.h2d_bytes_s, h.latency_s))
            rep.tiering = (SimOffload if offload else SimTiering)(rep, tiering, tool_stop, links)
            ctl.append(rep.tiering)
        if tiering.host_scope == "node":   # the simulated replicas are one node's GPUs
            share_hosts([c.host for c in ctl])
        elif tiering.host_scope == "node-lru":
            lru_hosts([c.host for c in ctl])
        elif tiering.host_scope == "pooled":
            pool_hosts([c.host for c in ctl])
        for v in sim.views:   # what the router sees: evicted KV is kept in host memory
            v.host_tier = True
        if not offload and tiering.host_scope != "pooled":
            from anchorage.sim.cluster import EventPool

            for c, rep in zip(ctl, sim.replicas):  # the host tier's CPU-medium KV events
                if isinstance(rep.pool, EventPool):  # go where the router reads the GPU's
                    c.host.events = rep.pool.events

    def wrap(p):
        return TieredEviction(wrap_policy(p) if wrap_policy is not None else p, agent_of)

    sim, out = simulate_timed(records, contexts, cfg, policy, router,
                              policy_params=policy_params, router_params=router_params,
                              wrap_policy=(wrap_policy if offload else wrap), prepare=attach)
    done, _ = measured_requests(sim)
    host_blocks = sum(r.host_hit_blocks for r in done)
    out["host_hit_blocks"] = host_blocks
    out["host_hit_rate"] = host_blocks / out["prompt_blocks"] if out["prompt_blocks"] else 0.0
    out["host_hit_tokens"] = sum(r.host_hit_tokens for r in done)
    tot = _merge([c.counters() for c in ctl])
    # a shared link's bytes are counted once
    hosts = [c if offload else c.host for c in ctl]
    links = {id(hst.d2h): hst for hst in hosts}
    tot["offload_bytes"] = sum(hst.d2h.bytes for hst in links.values())
    tot["reload_bytes"] = sum(hst.h2d.bytes for hst in links.values())
    tot["bytes_moved"] = tot["offload_bytes"] + tot["reload_bytes"]
    out.update(tot)
    out["reserved_blocks"] = {} if offload else _reserved_blocks(ctl)
    out["tiering"] = {
        "mode": tiering.mode, "host_capacity_bytes": h.capacity_bytes,
        "d2h_bytes_s": h.d2h_bytes_s, "h2d_bytes_s": h.h2d_bytes_s,
        "block_bytes": ctl[0].bb if ctl else None,
        "watermark": tiering.gate.watermark,
        "replicas_per_link": replicas_per_link,
    }
    if offload:
        out["tiering"].update(host_policy=tiering.host_policy,
                              reload_ahead=tiering.reload_ahead)
    return sim, out
