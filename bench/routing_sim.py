"""The cluster-simulation setup the router placement benchmarks share
(``bench_router_sim``, ``bench_router_capacity``, ``bench_router_bound``).

``h200-llama3-8b`` replicas with ``capacity`` KV blocks of 16 tokens each, every replica
under one eviction policy (``hybrid`` by default), on a generated multi-agent workload
(16 agents, 400 sessions, 16 concurrent sessions per replica, seed 1; ``topology``
``random`` by default), open-loop arrivals at a trace time multiplier ``scale`` (2.0 = half
the trace's rate). A *run* is the job ``(replicas, capacity, scale, router, policy,
topology)``; ``sim_run`` returns its row: hit rate, TTFT p50/p90/mean, throughput,
utilization and the miss decomposition of the fleet's prompt blocks
(``anchorage.routing.analysis``): ``compulsory`` (no earlier prompt anywhere held the
prefix), ``placement`` (an earlier prompt on *another* replica held it), ``capacity`` (this
replica had held it and evicted it, or it was still being computed), so hit + compulsory +
placement + capacity = 1; ``anchor_*`` are the shares on blocks shared across sessions.
For ``pooled`` (one cache of the fleet's size, the reference) placement is 0.

The *knee* of a rate sweep is the lowest rate at which ``round_robin``'s TTFT p90 exceeds
twice its value at the lightest rate (queueing starts to dominate: "near saturation").
"""

from __future__ import annotations

import argparse
import time

from anchorage.trace.generate import TOPOLOGIES

PROFILE = "h200-llama3-8b"
SIM_AGENTS, SIM_SESSIONS, SIM_CONCURRENCY_PER_REPLICA = 16, 400, 16
_TRACES: dict = {}


def add_sim_args(ap: argparse.ArgumentParser, *, capacity: bool = True) -> None:
    """The setup's options: eviction policy and topology (and the blocks per replica)."""
    if capacity:
        ap.add_argument("--capacity", type=int, default=4000, help="KV blocks per replica")
    ap.add_argument("--policy", default="hybrid", help="eviction policy of every replica")
    ap.add_argument("--topology", default="random", choices=TOPOLOGIES,
                    help="generated workload topology")


def workload_meta(topology: str) -> dict:
    return {"topology": topology, "agents": SIM_AGENTS, "sessions": SIM_SESSIONS,
            "concurrency_per_replica": SIM_CONCURRENCY_PER_REPLICA, "seed": 1,
            "block_size": 16}


def sim_trace(replicas: int, topology: str = "random"):
    """(records, contexts) of the workload for a fleet of ``replicas`` (cached)."""
    if (replicas, topology) not in _TRACES:
        from anchorage.sim.replay import make_contexts
        from anchorage.trace.generate import generate
        _, recs = generate(topology, SIM_AGENTS, SIM_SESSIONS, seed=1,
                           block_size=16, concurrency=SIM_CONCURRENCY_PER_REPLICA * replicas)
        _TRACES[replicas, topology] = (recs, make_contexts(recs))
    return _TRACES[replicas, topology]


def sim_config(replicas: int, capacity: int, scale: float):
    """``h200-llama3-8b`` replicas, 16-token blocks, open-loop arrivals."""
    from anchorage.sim.cluster import TimedConfig
    from anchorage.sim.profiles import get_profile
    return TimedConfig(get_profile(PROFILE).with_(block_size=16), replicas=replicas,
                       mode="open", time_scale=scale, capacity_blocks=capacity)


def miss_loss(sim) -> dict:
    """``miss_decomposition`` of a finished run's measured requests, in admission order
    (one cache for ``pooled``)."""
    from anchorage.routing.analysis import miss_decomposition
    done = sorted((r for r in sim.completed if r.measured and r.admitted_s is not None),
                  key=lambda r: (r.admitted_s, r.index))
    return miss_decomposition((r.ctx.keys, 0 if sim.pooled else r.replica, r.hit_blocks,
                               r.session) for r in done)


def sim_run(job: tuple) -> dict:
    """One simulation: (replicas, capacity, time scale, router, eviction policy, topology)."""
    from anchorage.sim.cluster import simulate_timed
    replicas, capacity, scale, router, policy, topology = job
    recs, ctxs = sim_trace(replicas, topology)
    cfg = sim_config(replicas, capacity, scale)
    t0 = time.perf_counter()
    c0 = time.process_time()
    sim, res = simulate_timed(recs, ctxs, cfg, policy, router)
    cpu = time.process_time() - c0
    span = recs[-1].timestamp / 1000.0 * scale
    util = [p["utilization"] for p in res["per_replica"]]
    loss = miss_loss(sim)
    return {"topology": topology, "replicas": replicas, "capacity_blocks": capacity,
            "time_scale": scale,
            "rate_rps": len(recs) / span, "router": router, "policy": policy,
            "hit_rate": res["hit_rate"], "ttft_p50_s": res["ttft_p50_s"],
            "ttft_p90_s": res["ttft_p90_s"], "ttft_mean_s": res["ttft_mean_s"],
            "throughput_rps": res["throughput_rps"], "preemptions": res["preemptions"],
            "utilization_mean": sum(util) / len(util), "utilization_max": max(util),
            "requests": res["requests"], "loss": loss,
            "decisions": dict(getattr(sim.router, "decisions", None) or {}),
            "sim_s": time.perf_counter() - t0, "sim_cpu_s": cpu}


def knee(curve: list[dict]) -> dict:
    """The lowest rate whose TTFT p90 exceeds twice the lightest rate's (else the heaviest)."""
    curve = sorted(curve, key=lambda r: r["rate_rps"])
    base = curve[0]["ttft_p90_s"]
    return next((r for r in curve if r["ttft_p90_s"] > 2 * base), curve[-1])


def targets(s: dict) -> dict:
    """Issue 5's targets on a summary row: agent >= 95 % of pooled's hit rate, >= prefix
    + 10 points, TTFT p90 at most half of round_robin's at the knee."""
    return {"pct_of_pooled>=95": s["agent_pct_of_pooled"] >= 0.95,
            "vs_prefix>=+10": s["agent_minus_prefix_points"] >= 10,
            "ttft_p90<=half_rr": s["agent_ttft_p90_over_round_robin"] <= 0.5}
