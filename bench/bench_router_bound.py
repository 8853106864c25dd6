"""The placement bound: how close any eviction policy can bring separate caches to the
pooled one, under ``agent``'s placement (``anchorage.routing.oracle``).

Setup: ``bench.routing_sim`` at ``--capacity`` blocks per replica. For each
``--at REPLICAS:SCALE`` (a knee of the sweep): Belady on the pooled cache; ``agent`` with
``--policy`` eviction, its placement recorded; and Belady per replica, each knowing only
its own requests' future, under that placement replayed: what no eviction policy can beat
with ``agent``'s placement. The pooled ``--policy`` run comes from the run cache
(``--cache``, shared with ``bench_router_capacity``) when it is there. A setting's rows
replace its earlier rows in the results file (``bench/results/router_sim_bound.json``),
which keeps the other settings.

    .venv/bin/python -m bench.bench_router_bound --at 4:1.75,8:1.5 [--capacity 4000]
        [--policy hybrid] [--topology random] [--cache runs.jsonl] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench import harness
from bench.routing_sim import PROFILE, add_sim_args, miss_loss, sim_config, sim_run, sim_trace


def bound_run(replicas: int, capacity: int, scale: float, topology: str, label: str,
              policy_of, router, pooled: bool = False) -> dict:
    """One simulation with a policy per replica (``policy_of(replica, contexts)``) and a
    router object (these runs hold objects: they run inline)."""
    from anchorage.policies.base import RequestContext as Ctx
    from anchorage.sim.cluster import ClusterSim, build_workload, summarize
    recs, ctxs0 = sim_trace(replicas, topology)
    cfg = sim_config(replicas, capacity, scale)
    ctxs = [Ctx(**{f: getattr(c, f) for f in c.__slots__}) for c in ctxs0]
    built = iter(range(replicas))  # ClusterSim builds one policy per replica, in order
    c0 = time.process_time()
    sim = ClusterSim(cfg, lambda: policy_of(next(built, 0), ctxs), router, pooled=pooled)
    sim.run(build_workload(recs, ctxs, cfg))
    res = summarize(sim, None, label, label)
    loss = miss_loss(sim)
    return {"label": label, "topology": topology, "replicas": replicas,
            "capacity_blocks": capacity, "time_scale": scale,
            "rate_rps": len(recs) / (recs[-1].timestamp / 1000.0 * scale),
            "hit_rate": res["hit_rate"], "ttft_p90_s": res["ttft_p90_s"], "loss": loss,
            "sim_cpu_s": time.process_time() - c0}


def bound_rows(n: int, sc: float, cap: int, pol: str, topo: str,
               cache: harness.RunCache) -> list[dict]:
    """The four runs of one setting: pooled ``pol``, pooled Belady, agent/``pol``, agent's
    placement with Belady per replica."""
    from anchorage.policies.registry import make_policy
    from anchorage.routing import make_router
    from anchorage.routing.oracle import RecordingRouter, ReplayRouter, replica_future_belady

    pooled = harness.run_jobs(sim_run, [(n, cap, sc, "pooled", pol, topo)], cache=cache)[0]
    pooled_pol = dict(pooled, label=f"pooled/{pol}")
    pooled_b = bound_run(n, cap, sc, topo, "pooled/belady",
                         lambda r, c: make_policy("belady", block_size=16, contexts=c),
                         None, pooled=True)
    rec = RecordingRouter(make_router("agent"))
    agent = bound_run(n, cap, sc, topo, f"agent/{pol}",
                      lambda r, c: make_policy(pol, block_size=16), rec)
    assign = rec.assignment
    part_b = bound_run(n, cap, sc, topo, "agent placement/belady (own replica's future)",
                       lambda r, c, a=assign: replica_future_belady(c, 16, a, r),
                       ReplayRouter(assign))
    return [pooled_pol, pooled_b, agent, part_b]


def summarize(n: int, sc: float, cap: int, topo: str, rows: list[dict]) -> dict:
    pooled_pol, pooled_b, agent, part_b = rows
    return {"replicas": n, "capacity_blocks": cap, "time_scale": sc, "topology": topo,
            "pooled_policy_hit": pooled_pol["hit_rate"], "pooled_belady_hit": pooled_b["hit_rate"],
            "agent_hit": agent["hit_rate"], "partitioned_belady_hit": part_b["hit_rate"],
            "partitioned_over_pooled_belady": part_b["hit_rate"] / pooled_b["hit_rate"],
            "partitioned_belady_over_pooled_policy": part_b["hit_rate"] / pooled_pol["hit_rate"],
            "agent_over_pooled_policy": agent["hit_rate"] / pooled_pol["hit_rate"]}


def setting(r: dict) -> tuple:
    return (r["replicas"], r["capacity_blocks"], r["time_scale"], r["topology"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--at", required=True, metavar="REPLICAS:SCALE,...",
                    help="fleet sizes and time scales (knees), e.g. 4:1.75,8:1.5")
    add_sim_args(ap)
    ap.add_argument("--cache", default="", metavar="FILE",
                    help="JSON-lines file of finished standard runs (reused, and resumed)")
    ap.add_argument("--out", default=str(harness.RESULTS / "router_sim_bound.json"))
    args = ap.parse_args(argv)
    pol, cap, topo = args.policy, args.capacity, args.topology
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {
        "benchmark": "router_sim_bound", "profile": PROFILE, "rows": [], "summary": []}
    data.pop("meta", None)
    print(f"placement bound, {cap} blocks per replica, {topo} topology, policy {pol}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    cache = harness.RunCache(args.cache or None)
    for item in args.at.split(","):
        n, sc = int(item.split(":")[0]), float(item.split(":")[1])
        rows = bound_rows(n, sc, cap, pol, topo, cache)
        s = summarize(n, sc, cap, topo, rows)
        for r in rows:
            print(f"  {n} replicas {r['label']:<48}{r['hit_rate']:>8.1%}  TTFT p90 "
                  f"{r['ttft_p90_s']:.2f} s", flush=True)
        print(f"  partitioned belady / pooled belady {s['partitioned_over_pooled_belady']:.1%}; "
              f"/ pooled {pol} {s['partitioned_belady_over_pooled_policy']:.1%}", flush=True)
        data["rows"] = harness.replace_rows(data["rows"], rows, setting)
        data["summary"] = harness.replace_rows(data["summary"], [s], setting)
        harness.write_json(out, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
