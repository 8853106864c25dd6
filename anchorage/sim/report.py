"""The timed simulation's report: which requests count, and the metrics over them
(``anchorage.sim.cluster``'s ``summarize``; specification there, "Warm-up" and the closed
loop's steady-state window)."""

from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

from anchorage.percentile import percentile


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def measured_requests(sim) -> tuple[list, tuple[float, float] | None]:
    """The completed requests every metric is computed over, and the steady-state window
    (None without ``max_sessions``)."""
    done = [r for r in sim.completed if r.measured]
    if sim.cfg.max_sessions is None:
        return done, None
    hi = sim.last_start_s
    lo = max(sim.cfg.warmup_s, sim.cfg.warmup_frac * hi)
    if hi <= lo:
        return [r for r in done if r.arrival_s <= hi], None
    # every metric covers the steady state, not only throughput: requests of the ramp-up
    # (before lo) leave TTFT and hit rate as they leave turns/s
    return [r for r in done if lo <= r.arrival_s <= hi], (lo, hi)


def summarize(sim, workload, policy_name: str,
              router_name: str) -> dict[str, Any]:
    done, window = measured_requests(sim)
    ttft = [r.first_token_s - r.arrival_s for r in done]
    # TTFT = waiting for admission (queue: no free seat, budget or KV blocks) + prefill
    queue = [r.admitted_s - r.arrival_s for r in done if r.admitted_s is not None]
    lat = [r.finish_s - r.arrival_s for r in done]
    hit_blocks = sum(r.hit_blocks for r in done)
    prompt_blocks = sum(len(r.ctx.keys) * (1 + r.preemptions) for r in done)
    prefill = sum(r.prefill_tokens for r in done)
    hit_t = sum(r.hit_tokens for r in done)
    computed = sum(r.computed_tokens for r in done)
    t0 = min((r.arrival_s for r in done), default=0.0)
    t1 = max((r.finish_s for r in done), default=0.0)
    span = max(t1 - t0, 1e-9)
    if window is not None:
        span = window[1] - window[0]
        throughput = sum(1 for r in sim.completed
                         if window[0] <= r.finish_s <= window[1]) / span
    else:
        throughput = len(done) / span
    sessions: dict[Hashable, list[float]] = {}
    for r in done:
        if r.session is None:
            continue
        s = sessions.setdefault(r.session, [r.arrival_s, r.finish_s])
        s[0] = min(s[0], r.arrival_s)
        s[1] = max(s[1], r.finish_s)
    sess_times = [b - a for a, b in sessions.values()]
    evictions = sum(p.stats.evictions for p in sim.pools)
    per_replica = []
    for rep in sim.replicas:
        st = rep.stats
        rdone = [r for r in done if r.replica == rep.index]
        per_replica.append({
            "replica": rep.index,
            "requests": len(rdone),
            "hit_rate": st.hit_blocks / st.prompt_blocks if st.prompt_blocks else 0.0,
            "hit_blocks": st.hit_blocks, "prompt_blocks": st.prompt_blocks,
            "computed_tokens": st.computed_tokens,
            "evictions": None if sim.pooled else rep.pool.stats.evictions,
            "preemptions": st.preemptions,
            "ttft_p90_s": percentile([r.first_token_s - r.arrival_s for r in rdone], 90),
            "ttft_mean_s": _mean([r.first_token_s - r.arrival_s for r in rdone]),
            "utilization": st.busy_s / max(sim.now, 1e-9),  # over the whole run
            "steps": st.steps,
        })
    return {
        "policy": policy_name, "router": router_name, "replicas": len(sim.replicas),
        "hit_rate": hit_blocks / prompt_blocks if prompt_blocks else 0.0,
        "token_hit_rate": hit_t / prefill if prefill else 0.0,
        "hit_blocks": hit_blocks, "prompt_blocks": prompt_blocks,
        "prefill_tokens": prefill, "hit_tokens": hit_t,
        "recomputed_tokens": computed, "evictions": evictions,
        "preemptions": sum(r.preemptions for r in done),
        "requests": len(sim.completed), "measured_requests": len(done),
        "rejected": len(sim.rejected),
        "ttft_mean_s": _mean(ttft), "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90), "ttft_p99_s": percentile(ttft, 99),
        "queue_mean_s": _mean(queue),
        "latency_mean_s": _mean(lat), "latency_p50_s": percentile(lat, 50),
        "latency_p90_s": percentile(lat, 90), "latency_p99_s": percentile(lat, 99),
        "throughput_rps": throughput,
        "window_s": list(window) if window else None,
        "session_time_mean_s": _mean(sess_times),
        "session_time_p90_s": percentile(sess_times, 90),
        "makespan_s": sim.now,
        "per_replica": per_replica,
    }


