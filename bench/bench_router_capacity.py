"""Router placement quality against the KV capacity per replica, the knee re-found at each.

Setup: ``bench.routing_sim``. ``--capacities 4000,8000,16000,profile`` are KV blocks per
replica (``profile`` = the hardware's own budget, 50,945 blocks of 16 tokens for
Llama-3-8B on an H200 at ``gpu_memory_utilization`` 0.9). At each capacity the knee is
re-found (a larger cache removes prefill work, so it moves to a higher rate; see
``sweep_one``), then ``agent``, ``pooled`` and ``prefix`` run there. ``--cache FILE`` keeps
finished runs (JSON lines, ``bench.harness.RunCache``) so a sweep resumes and shares runs
with ``bench_router_bound``. Results: ``bench/results/router_sim_capacity_<topology>.json``.

    .venv/bin/python -m bench.bench_router_capacity [--replicas 4,8]
        [--capacities 4000,8000,16000,profile] [--topology random] [--cache runs.jsonl]
        [--jobs N] [--out F]
"""

from __future__ import annotations

import argparse
import os
import sys

from bench import harness
from bench.routing_sim import PROFILE, add_sim_args, sim_run, targets, workload_meta

SWEEP_SCALES = (2.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.85, 0.7, 0.55, 0.45, 0.35)
KNEE_RULE = ("lowest rate with round_robin TTFT p90 > 2x its value at scale 2.5; "
             "the search starts at the previous (smaller) capacity's knee")


def sweep_one(n: int, cap: int, pol: str, topo: str, start: int, cache: harness.RunCache,
              fanout: harness.Fanout = harness.Fanout()) -> tuple[dict, list, int]:
    """One (replicas, capacity): round_robin at the lightest scale (the TTFT base), then
    heavier scales from ``start`` until its TTFT p90 exceeds twice the base (the knee);
    agent, pooled and prefix at the knee. A larger cache only removes prefill work, so
    a capacity's knee is never at a lower rate than a smaller capacity's: the search for
    the next capacity starts at this knee (the scales it skips are not run)."""
    def run(jobs: list[tuple]) -> list[dict]:
        return harness.run_jobs(sim_run, jobs, fanout, cache=cache)

    base = run([(n, cap, SWEEP_SCALES[0], "round_robin", pol, topo)])[0]
    used = [base]
    i = max(start, 1)
    while True:
        rr = run([(n, cap, SWEEP_SCALES[i], "round_robin", pol, topo)])[0]
        used.append(rr)
        if rr["ttft_p90_s"] > 2 * base["ttft_p90_s"] or i == len(SWEEP_SCALES) - 1:
            break
        i += 1
    sc = SWEEP_SCALES[i]
    at = {"round_robin": rr}
    routers = ("agent", "pooled", "prefix")
    for r, row in zip(routers, run([(n, cap, sc, r, pol, topo) for r in routers])):
        at[r] = row
        used.append(row)
    ref = at["pooled"]["hit_rate"]
    a = at["agent"]
    s = {"replicas": n, "capacity_blocks": cap, "knee_time_scale": sc,
         "knee_rate_rps": a["rate_rps"], "knee_found": rr["ttft_p90_s"] > 2 * base["ttft_p90_s"],
         "round_robin_base_ttft_p90_s": base["ttft_p90_s"],
         **{f"{r}_hit": at[r]["hit_rate"] for r in at},
         **{f"{r}_ttft_p90_s": at[r]["ttft_p90_s"] for r in at},
         **{f"{r}_loss": {k: at[r]["loss"][k] for k in ("compulsory", "placement", "capacity")}
            for r in at},
         "agent_pct_of_pooled": a["hit_rate"] / ref,
         "agent_minus_prefix_points": 100 * (a["hit_rate"] - at["prefix"]["hit_rate"]),
         "agent_ttft_p90_over_round_robin": a["ttft_p90_s"] / rr["ttft_p90_s"]}
    s["targets_met"] = targets(s)
    return s, used, i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="4,8", help="fleet sizes, comma-separated")
    ap.add_argument("--capacities", default="4000,8000,16000,profile",
                    help="KV blocks per replica, comma list; 'profile' = the hardware's budget")
    add_sim_args(ap, capacity=False)
    ap.add_argument("--cache", default="", metavar="FILE",
                    help="JSON-lines file of finished runs (reused, and resumed)")
    ap.add_argument("--out", default=None)
    harness.add_fanout_args(ap)
    args = ap.parse_args(argv)
    from anchorage.sim.profiles import get_profile
    hw = get_profile(PROFILE).with_(block_size=16).capacity_blocks
    caps = sorted({hw if c.strip() == "profile" else int(c) for c in args.capacities.split(",")})
    sizes = [int(x) for x in args.replicas.split(",")]
    pol, topo = args.policy, args.topology
    out = args.out or str(harness.RESULTS / f"router_sim_capacity_{topo}.json")
    cache = harness.RunCache(args.cache or None)
    fan = harness.Fanout.from_args(args)
    load = os.getloadavg()[0]
    print(f"capacity sweep, {PROFILE} (hardware KV budget {hw} blocks of 16 tokens), "
          f"{pol} eviction, {topo} topology, open loop; load average {load:.1f}", flush=True)
    summary, rows = [], []
    for n in sizes:
        start = 1
        for cap in caps:
            s, used, start = sweep_one(n, cap, pol, topo, start, cache, fan)
            summary.append(s)
            rows += used
            print(f"{n} replicas, {cap:>6} blocks: knee {s['knee_rate_rps']:.2f} req/s "
                  f"(scale {s['knee_time_scale']}); pooled {s['pooled_hit']:.1%} agent "
                  f"{s['agent_hit']:.1%} ({s['agent_pct_of_pooled']:.1%}) prefix "
                  f"{s['prefix_hit']:.1%} ({s['agent_minus_prefix_points']:+.1f}) rr "
                  f"{s['round_robin_hit']:.1%}; TTFT p90 agent/rr "
                  f"{s['agent_ttft_p90_over_round_robin']:.2f}", flush=True)
    harness.write_json(out, {
        "benchmark": "router_sim_capacity_sweep", "profile": PROFILE,
        "hardware_capacity_blocks": hw, "policy": pol, "capacities": caps,
        "workload": workload_meta(topo), "arrivals": "open", "scales": list(SWEEP_SCALES),
        "knee_rule": KNEE_RULE, "load_average": load, "summary": summary, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
