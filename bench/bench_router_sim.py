"""Router placement quality in the cluster simulator: hit rate and TTFT per router near
saturation.

Setup: ``bench.routing_sim`` (``h200-llama3-8b`` replicas, ``--capacity`` KV blocks each,
``--policy`` eviction, a generated ``--topology`` workload, open-loop arrivals), swept over
the trace time multipliers ``--scales``. For each fleet size (``--replicas 4,8``):
``round_robin`` and ``agent`` at every rate (the TTFT curve), then ``pooled`` (one cache of
the fleet's total size: the reference), ``prefix`` and ``least_loaded`` at the knee.
Targets (issue 5): ``agent`` >= 95 % of ``pooled``'s hit rate and >= ``prefix`` + 10
points, and TTFT p90 at most half of ``round_robin``'s at the knee. Results:
``bench/results/router_sim.json`` (``random``), ``router_sim_<topology>.json`` otherwise.

    .venv/bin/python -m bench.bench_router_sim [--replicas 4,8] [--scales 2.5,2,1.75,1.5]
        [--capacity 4000] [--policy hybrid] [--topology random] [--jobs N] [--out F]
"""

from __future__ import annotations

import argparse
import os
import sys

from bench import harness
from bench.routing_sim import (
    PROFILE,
    add_sim_args,
    knee,
    sim_run,
    targets,
    workload_meta,
)

KNEE_RULE = "lowest rate with round_robin TTFT p90 > 2x the lightest rate's"


def curve_table(rows: list[dict], n: int, scales: list[float]) -> str:
    def at(sc: float, router: str) -> dict:
        return next(r for r in rows if (r["replicas"], r["time_scale"], r["router"]) == (n, sc, router))

    pairs = [(at(sc, "round_robin"), at(sc, "agent")) for sc in scales]
    C = harness.Column
    return harness.table([
        C("rate rps", lambda p: p[0]["rate_rps"], ".2f", 9),
        C("rr p90 s", lambda p: p[0]["ttft_p90_s"], ".2f", 10),
        C("agent p90 s", lambda p: p[1]["ttft_p90_s"], ".2f", 13),
        C("ratio", lambda p: p[1]["ttft_p90_s"] / p[0]["ttft_p90_s"], ".2f", 7),
        C("rr hit", lambda p: p[0]["hit_rate"], ".1%", 8),
        C("agent hit", lambda p: p[1]["hit_rate"], ".1%", 10),
        C("rr util", lambda p: p[0]["utilization_mean"], ".2f", 9)], pairs, sep="")


def knee_table(at: dict, ref: float) -> str:
    C = harness.Column
    rows = [dict(name=name, **at[name]) for name in
            ("pooled", "agent", "prefix", "least_loaded", "round_robin")]
    return harness.table([
        C("router", "name", width=14, align="<"), C("hit", "hit_rate", ".1%", 8),
        C("% pooled", lambda r: r["hit_rate"] / ref, ".1%", 10),
        C("TTFT p90 s", "ttft_p90_s", ".2f", 12), C("p50 s", "ttft_p50_s", ".2f", 8),
        C("compuls.", lambda r: r["loss"]["compulsory"], ".1%", 10),
        C("placem.", lambda r: r["loss"]["placement"], ".1%", 9),
        C("capacity", lambda r: r["loss"]["capacity"], ".1%", 10)], rows, sep="")


def summarize(rows: list[dict], n: int, knee_scale: float) -> dict:
    at = {r["router"]: r for r in rows if r["replicas"] == n and r["time_scale"] == knee_scale}
    a, ref = at["agent"], at["pooled"]["hit_rate"]
    s = {"replicas": n, "knee_time_scale": knee_scale, "knee_rate_rps": a["rate_rps"],
         "agent_pct_of_pooled": a["hit_rate"] / ref,
         "agent_minus_prefix_points": 100 * (a["hit_rate"] - at["prefix"]["hit_rate"]),
         "agent_ttft_p90_over_round_robin": a["ttft_p90_s"] / at["round_robin"]["ttft_p90_s"]}
    s["targets_met"] = targets(s)
    return s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="4,8", help="fleet sizes, comma-separated")
    ap.add_argument("--scales", default="2.5,2,1.75,1.5",
                    help="open-loop trace time multipliers (the rate sweep)")
    add_sim_args(ap)
    ap.add_argument("--out", default=None)
    harness.add_fanout_args(ap)
    args = ap.parse_args(argv)
    out = args.out or str(harness.RESULTS / ("router_sim.json" if args.topology == "random"
                                             else f"router_sim_{args.topology}.json"))
    sizes = [int(x) for x in args.replicas.split(",")]
    scales = sorted((float(x) for x in args.scales.split(",")), reverse=True)
    pol, cap, topo = args.policy, args.capacity, args.topology
    fan = harness.Fanout.from_args(args)
    load = os.getloadavg()[0]
    print(f"cluster simulation, {PROFILE}, {cap} blocks per replica, {pol} eviction, "
          f"{topo} topology, open loop; load average {load:.1f}", flush=True)
    rows = harness.run_jobs(sim_run, [(n, cap, sc, r, pol, topo) for n in sizes for sc in scales
                                      for r in ("round_robin", "agent")], fan)
    knees = {n: knee([r for r in rows if r["replicas"] == n and r["router"] == "round_robin"]
                     )["time_scale"] for n in sizes}
    rows += harness.run_jobs(sim_run, [(n, cap, knees[n], r, pol, topo) for n in sizes
                                       for r in ("pooled", "prefix", "least_loaded")], fan)
    summary = []
    for n in sizes:
        print(f"\n{n} replicas: TTFT p90 curve (knee: time scale {knees[n]})")
        print(curve_table(rows, n, scales))
        at = {r["router"]: r for r in rows if r["replicas"] == n and r["time_scale"] == knees[n]}
        print(f"at the knee ({at['round_robin']['rate_rps']:.2f} req/s):")
        print(knee_table(at, at["pooled"]["hit_rate"]))
        s = summarize(rows, n, knees[n])
        summary.append(s)
        print(f"agent: {s['agent_pct_of_pooled']:.1%} of pooled, "
              f"{s['agent_minus_prefix_points']:+.1f} points vs prefix, TTFT p90 x"
              f"{s['agent_ttft_p90_over_round_robin']:.2f} of round_robin; {s['targets_met']}")
    harness.write_json(out, {
        "benchmark": "router_sim_placement", "profile": PROFILE, "policy": pol,
        "capacity_blocks": cap, "workload": workload_meta(topo),
        "arrivals": "open", "knee_rule": KNEE_RULE,
        "load_average": load, "summary": summary, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
