"""Timed cluster simulation near saturation: mean TTFT and peak throughput per policy.

Setup (issue 3's timed target): 4 replicas of ``h200-llama3-8b`` behind ``round_robin``,
a closed-loop multi-agent workload from the generator (``selector`` topology, 6 agents,
seeded): each session's next turn arrives when its previous turn completed plus the tool
time (or think time). Load is swept as a closed system of N concurrent session slots
(``TimedConfig.max_sessions``): a new session starts when one ends, so N is the number of
agent sessions in flight. Each level runs ``sessions_per_slot x N`` sessions (at least
``--min-sessions``); metrics cover the steady state (after the first 20 % of the window,
until the last session start).

- Peak throughput of a policy = the highest turns/s over the sweep.
- Saturation load = the lightest N of the sweep where ``lru`` reaches 95 % of its own
  peak throughput (the knee); mean TTFT is compared there ("near saturation").
- Target (issue 3): ``hybrid`` mean TTFT >= 30 % lower and peak throughput >= 20 % higher
  than ``lru``. The table prints the measured ratios for every policy.
- ``--seeds 1,2,3``: every (seed, N, policy) is run; curves (turns/s and TTFT by N) are
  averaged over seeds, the knee is taken on lru's mean curve, and the ratios are those of
  the means; the per-seed ratios at that N (``spread``) show how much one seed (which
  replica jams) moves them.
- ``--admission prefix-aware``: replicas admit in anchorage's prefix-aware order (fewest
  new blocks first, aged) instead of first-come-first-served, for every policy.
- ``--output-scale s`` multiplies every request's output length (at least 1 token):
  agentic turns whose output is a short tool call are prefill-heavy.
- ``--tool-gaps weka`` maps the generated tool durations onto the real WEKA Claude Code
  tool-gap distribution (rank-based quantile mapping, ``anchorage.sim.gaps``: median 8 s,
  p90 68 s instead of the generator's sub-second medians; the order of gaps, hence what
  ``tool_name``/``tool_args`` predict, is kept). ``generator`` (default) keeps them.

Usage::

    .venv/bin/python -m bench.bench_timed [--quick] [--policies lru,arc,...]
        [--slots 16,32,64,128,256] [--sessions-per-slot 3] [--jobs 2] [--ray-address ADDR]
        [--topology selector] [--seeds 1,2,3] [--output-scale 1]
        [--capacity-blocks 8192] [--tool-gaps generator|weka]
        [--out bench/results/timed.json]

Runs are deterministic for a seed; a policy that raises is reported as an error row.
``--merge a.json,b.json --out c.json`` combines files of one sweep run with different
``--seeds`` (e.g. one process per seed) into the file one run with all the seeds writes.
``--jobs N`` / ``--ray-address`` run the (seed, N, policy) runs as Ray tasks
(``bench.harness``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

from anchorage.policies.registry import policy_names
from anchorage.sim.cluster import TimedConfig, run_timed
from anchorage.sim.gaps import TOOL_GAPS, closed_loop_gaps_s, match_tool_gaps
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from bench import harness

DEFAULT_POLICIES = ["lru", "arc", "s3fifo", "lfu", "ttl", "infercept", "cachescout",
                    "cachewise", "hybrid"]
_WL: dict = {}


def workload(topology: str, sessions: int, seed: int, concurrency: float,
             output_scale: float = 1.0, tool_gaps: str = "generator"):
    key = (topology, sessions, seed, concurrency, output_scale, tool_gaps)
    if key not in _WL:
        from anchorage.trace.generate import generate
        _, recs = generate(topology, 6, sessions, seed, concurrency=concurrency)
        if output_scale != 1.0:
            recs = [dataclasses.replace(
                r, output_length=max(1, int(round(r.output_length * output_scale))))
                for r in recs]
        if TOOL_GAPS[tool_gaps] is not None:
            recs = match_tool_gaps(recs, TOOL_GAPS[tool_gaps])
        _WL[key] = (recs, make_contexts(recs))
    return _WL[key]


def timed_config(profile: str, replicas: int, slots: int, capacity_blocks: int | None,
                 admission: str = "fcfs") -> TimedConfig:
    """The benchmark's closed system: N = ``slots`` sessions in flight, session starts
    compressed (time scale 1e-3), the first 20 % of the window excluded."""
    return TimedConfig(get_profile(profile), replicas=replicas, mode="closed", time_scale=1e-3,
                       max_sessions=slots, warmup_frac=0.2, capacity_blocks=capacity_blocks,
                       admission=admission)


def one_run(job: dict) -> dict:
    recs, ctxs = workload(job["topology"], job["sessions"], job["seed"], job["concurrency"],
                          job.get("output_scale", 1.0), job.get("tool_gaps", "generator"))
    cfg = timed_config(job["profile"], job["replicas"], job["slots"], job["capacity_blocks"],
                       job.get("admission", "fcfs"))
    params = None
    if job["policy"] == "cachewise-oracle":  # true gaps on the simulator's clock
        params = {"next_gap_s": closed_loop_gaps_s(recs, cfg.think_s)}
    t0 = time.perf_counter()
    c0 = time.process_time()
    try:
        res = run_timed(recs, ctxs, cfg, job["policy"], job["router"], policy_params=params)
    except Exception as exc:  # a policy that crashes is reported, not fatal
        return {**job, "error": f"{type(exc).__name__}: {exc}"}
    return {**job, **res, "wall_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default=None,
                    help="comma-separated (default: every registered one of "
                         + ",".join(DEFAULT_POLICIES) + ")")
    ap.add_argument("--slots", default="16,32,64,128,256",
                    help="concurrent session slots N, light to heavy load")
    ap.add_argument("--sessions-per-slot", type=float, default=3.0)
    ap.add_argument("--min-sessions", type=int, default=150)
    ap.add_argument("--concurrency", type=float, default=64.0,
                    help="generator's nominal concurrency (session overlap in its clock)")
    ap.add_argument("--topology", default="selector")
    ap.add_argument("--seed", type=int, default=None, help="one seed (same as --seeds N)")
    ap.add_argument("--seeds", default="1", help="comma-separated workload seeds")
    ap.add_argument("--output-scale", type=float, default=1.0,
                    help="multiply every request's output length (prefill-heavy turns: < 1)")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--router", default="round_robin")
    ap.add_argument("--profile", default="h200-llama3-8b")
    ap.add_argument("--capacity-blocks", type=int, default=8192,
                    help="KV blocks per replica (default 8192 = 128k tokens = 16 GiB of "
                         "Llama-3-8B KV; 0 = the profile's whole memory)")
    ap.add_argument("--admission", default="fcfs", choices=["fcfs", "prefix-aware"],
                    help="replica admission order (prefix-aware: anchorage's scheduler)")
    ap.add_argument("--tool-gaps", default="generator", choices=sorted(TOOL_GAPS),
                    help="tool-gap distribution: the generator's own, or mapped onto the "
                         "real WEKA Claude Code gaps (anchorage.sim.gaps)")
    ap.add_argument("--quick", action="store_true", help="3 light loads, fewer sessions")
    ap.add_argument("--merge", default=None,
                    help="comma-separated result files of the same sweep run with different "
                         "--seeds (e.g. in parallel): write their combined summary to --out "
                         "and run nothing")
    ap.add_argument("--out", default=str(harness.RESULTS / "timed.json"))
    harness.add_fanout_args(ap)
    args = ap.parse_args()
    if args.merge:
        return merge([p for p in args.merge.split(",") if p], args.out)
    if args.quick:
        args.slots, args.sessions_per_slot, args.min_sessions = "8,24,48", 2.0, 40
    try:
        seeds = ([args.seed] if args.seed is not None
                 else [int(x) for x in args.seeds.split(",") if x])
    except ValueError:
        print(f"--seeds must be comma-separated integers, got {args.seeds!r}", file=sys.stderr)
        return 2
    if not seeds or not args.output_scale > 0:
        print("need at least one seed and --output-scale > 0", file=sys.stderr)
        return 2
    known = policy_names()
    if args.policies:
        policies = [p for p in args.policies.split(",") if p]
        bad = [p for p in policies if p not in known]
        if bad:
            print(f"unknown policies {bad}; known: {known}", file=sys.stderr)
            return 2
    else:
        policies = [p for p in DEFAULT_POLICIES if p in known]
    scales = [int(s) for s in args.slots.split(",")]
    jobs = [dict(policy=p, scale=n, slots=n, topology=args.topology,
                 sessions=max(args.min_sessions, int(round(args.sessions_per_slot * n))),
                 seed=seed, concurrency=args.concurrency, replicas=args.replicas,
                 router=args.router, profile=args.profile, output_scale=args.output_scale,
                 admission=args.admission, tool_gaps=args.tool_gaps,
                 capacity_blocks=args.capacity_blocks or None)
            for seed in seeds for n in scales for p in policies]
    t0 = time.perf_counter()
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    runs = harness.run_jobs(one_run, jobs, harness.Fanout.from_args(args), on_result=progress)
    summary = summarize_seeds(runs, policies, scales, seeds)
    print(format_table(summary, args))
    out = {
        "bench": "timed", "profile": args.profile, "replicas": args.replicas,
        "capacity_blocks": args.capacity_blocks or get_profile(args.profile).capacity_blocks,
        "router": args.router, "topology": args.topology,
        "sessions_per_slot": args.sessions_per_slot, "min_sessions": args.min_sessions,
        "seeds": seeds, "output_scale": args.output_scale, "admission": args.admission,
        "tool_gaps": args.tool_gaps,
        "concurrency": args.concurrency, "slots": scales,
        "machine": platform.node(), "load_avg_start": load_avg,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": sum(r.get("cpu_s", 0.0) for r in runs),
        "saturation_slots": summary["saturation_scale"],
        "policies": summary["policies"],
        "per_seed": summary["per_seed"],
        "runs": runs,  # with per_replica: load imbalance explains TTFT tails
    }
    harness.write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


def progress(j: dict, r: dict) -> None:
    print(f"  seed {j['seed']} N={j['slots']:<5} {j['policy']:<11} "
          + (r["error"] if "error" in r else
             f"{r['throughput_rps']:.2f} turns/s  TTFT {r['ttft_mean_s']:.3f}s  "
             f"hit {r['hit_rate']:.1%}  ({r['cpu_s']:.0f}s CPU)"), flush=True)


_PER_RUN = {"seeds", "wall_s", "cpu_s", "load_avg_start", "machine", "saturation_slots",
            "policies", "per_seed", "runs", "merged_from", "meta"}


def merge(paths: list[str], out_path: str) -> int:
    """Combine result files that differ only in their seeds into one (``--merge``)."""
    try:
        docs = [json.loads(Path(p).read_text()) for p in paths]
    except (OSError, ValueError) as exc:
        print(f"--merge: cannot read a result file: {exc}", file=sys.stderr)
        return 2
    if not docs or any(d.get("bench") != "timed" for d in docs):
        print("--merge needs bench_timed result files", file=sys.stderr)
        return 2
    base = {k: v for k, v in docs[0].items() if k not in _PER_RUN}
    for p, d in zip(paths, docs):
        diff = sorted(k for k in set(base) | (set(d) - _PER_RUN) if d.get(k) != base.get(k))
        if diff:
            print(f"--merge: {p} differs from {paths[0]} in {diff}", file=sys.stderr)
            return 2
    seeds = sorted(s for d in docs for s in d["seeds"])
    if len(set(seeds)) != len(seeds):
        print(f"--merge: a seed appears twice ({seeds})", file=sys.stderr)
        return 2
    runs = [r for d in docs for r in d["runs"]]
    policies = list(docs[0]["policies"])
    scales = base["slots"]
    summary = summarize_seeds(runs, policies, scales, seeds)
    view = argparse.Namespace(
        replicas=base["replicas"], profile=base["profile"], router=base["router"],
        topology=base["topology"], admission=base["admission"],
        capacity_blocks=base["capacity_blocks"], output_scale=base["output_scale"],
        tool_gaps=base.get("tool_gaps", "generator"), seed=None,
        seeds=",".join(map(str, seeds)), slots=",".join(map(str, scales)))
    print(format_table(summary, view))
    out = {**base, "seeds": seeds, "merged_from": paths,
           "machine": sorted({d.get("machine") for d in docs}),
           "wall_s": max(d.get("wall_s", 0.0) for d in docs),
           "cpu_s": sum(d.get("cpu_s", 0.0) for d in docs),
           "saturation_slots": summary["saturation_scale"],
           "policies": summary["policies"], "per_seed": summary["per_seed"], "runs": runs}
    harness.write_json(out_path, out)
    print(f"wrote {out_path}")
    return 0


def summarize(runs: list[dict], policies: list[str], scales: list[float]) -> dict:
    by = {(r["policy"], r["scale"]): r for r in runs}
    ok = lambda r: r is not None and "error" not in r  # noqa: E731
    base = [by.get(("lru", s)) for s in scales]
    sat = scales[-1]
    if "lru" in policies and all(ok(r) for r in base):
        peak = max(r["throughput_rps"] for r in base)
        sat = next(s for s, r in zip(scales, base) if r["throughput_rps"] >= 0.95 * peak)
    out = {}
    lru_peak = lru_ttft = None
    for p in policies:
        rs = [by.get((p, s)) for s in scales]
        if not all(ok(r) for r in rs):
            err = next(r["error"] for r in rs if r is not None and "error" in r)
            out[p] = {"error": err}
            continue
        at = by[(p, sat)]
        out[p] = {
            "peak_throughput_rps": max(r["throughput_rps"] for r in rs),
            "ttft_mean_s": at["ttft_mean_s"], "ttft_p90_s": at["ttft_p90_s"],
            "ttft_p99_s": at["ttft_p99_s"], "hit_rate": at["hit_rate"],
            "latency_mean_s": at["latency_mean_s"],
            "session_time_mean_s": at["session_time_mean_s"],
            "throughput_rps": at["throughput_rps"],
            "ttft_mean_by_slots": {str(s): r["ttft_mean_s"] for s, r in zip(scales, rs)},
            "throughput_by_slots": {str(s): r["throughput_rps"] for s, r in zip(scales, rs)},
            "hit_rate_by_slots": {str(s): r["hit_rate"] for s, r in zip(scales, rs)},
        }
        if p == "lru":
            lru_peak, lru_ttft = out[p]["peak_throughput_rps"], out[p]["ttft_mean_s"]
    for p, d in out.items():
        if "error" in d or lru_peak is None:
            continue
        d["ttft_reduction_vs_lru"] = 1.0 - d["ttft_mean_s"] / lru_ttft if lru_ttft else None
        d["peak_gain_vs_lru"] = d["peak_throughput_rps"] / lru_peak - 1.0
        if p == "hybrid":
            d["target_met"] = (d["ttft_reduction_vs_lru"] >= 0.30
                               and d["peak_gain_vs_lru"] >= 0.20)
    return {"saturation_scale": sat, "policies": out}


_AVG = ("throughput_rps", "ttft_mean_s", "ttft_p90_s", "ttft_p99_s", "hit_rate",
        "latency_mean_s", "session_time_mean_s", "queue_mean_s", "preemptions")


def summarize_seeds(runs: list[dict], policies: list[str], scales: list[float],
                    seeds: list[int]) -> dict:
    """Seed-mean curves summarized like one seed (``summarize``), plus per-seed ratios at
    the mean curve's knee (``spread``: min and max over seeds)."""
    per_seed = {s: summarize([r for r in runs if r["seed"] == s], policies, scales)
                for s in seeds}
    if len(seeds) == 1:
        out = per_seed[seeds[0]]
        return {**out, "per_seed": {str(seeds[0]): out}}
    by: dict = {}
    for r in runs:
        by.setdefault((r["policy"], r["scale"]), []).append(r)
    mean_runs = []
    for (p, n), rs in by.items():
        err = next((r for r in rs if "error" in r), None)
        if err is not None or len(rs) != len(seeds):
            mean_runs.append(err or {"policy": p, "scale": n, "error": "missing seed"})
            continue
        m = {"policy": p, "scale": n}
        for k in _AVG:
            m[k] = sum(r[k] for r in rs) / len(rs)
        mean_runs.append(m)
    out = summarize(mean_runs, policies, scales)
    sat = out["saturation_scale"]
    for p, d in out["policies"].items():
        if "error" in d or "ttft_reduction_vs_lru" not in d:
            continue
        ttft, peak = [], []
        for s in seeds:
            rs = {(r["policy"], r["scale"]): r for r in runs if r["seed"] == s}
            base_at, at = rs[("lru", sat)], rs[(p, sat)]
            ttft.append(at["ttft_mean_s"] / base_at["ttft_mean_s"] - 1.0)
            lp = max(rs[("lru", n)]["throughput_rps"] for n in scales)
            pp = max(rs[(p, n)]["throughput_rps"] for n in scales)
            peak.append(pp / lp - 1.0)
        d["spread"] = {"ttft_vs_lru_per_seed": ttft, "peak_vs_lru_per_seed": peak}
    out["per_seed"] = {str(s): v for s, v in per_seed.items()}
    return out


def format_table(summary: dict, args) -> str:
    sat = summary["saturation_scale"]

    def note(d: dict) -> str:
        out = ("  target met" if d.get("target_met") else
               "  target missed" if "target_met" in d else "")
        if "spread" in d:
            sp = d["spread"]
            out += ("  per seed: TTFT " + "/".join(format(x, "+.1%") for x in sp["ttft_vs_lru_per_seed"])
                    + " peak " + "/".join(format(x, "+.1%") for x in sp["peak_vs_lru_per_seed"]))
        return out
    C = harness.Column
    ok = [dict(d, name=p) for p, d in summary["policies"].items() if "error" not in d]
    table = harness.table([
        C("policy", "name", width=12, align="<"), C("hit rate", "hit_rate", ".1%", 9),
        C("TTFT mean", lambda d: f"{d['ttft_mean_s']:.3f}s", width=11),
        C("p90", lambda d: f"{d['ttft_p90_s']:.3f}s", width=9),
        C("p99", lambda d: f"{d['ttft_p99_s']:.3f}s", width=9),
        C("turns/s", "throughput_rps", ".2f", 9), C("peak/s", "peak_throughput_rps", ".2f", 9),
        C("TTFT vs lru", lambda d: None if d.get("ttft_reduction_vs_lru") is None
          else -d["ttft_reduction_vs_lru"], "+.1%", 13, missing=""),
        C("peak vs lru", lambda d: d.get("peak_gain_vs_lru"), "+.1%", 13, missing=""),
        C("", note, align="<")], ok, sep="", rule=True)
    lines = [f"timed: {args.replicas} x {args.profile}, {args.router}, {args.topology} "
             f"closed-loop, {args.admission} admission, "
             f"{args.capacity_blocks or 'all'} blocks/replica, output x "
             f"{args.output_scale:g}, {args.tool_gaps} tool gaps, "
             f"seeds {args.seeds if args.seed is None else args.seed} "
             f"(means); near saturation = N {sat} concurrent sessions "
             f"(columns at N {sat}; peak over N = {args.slots})", table]
    lines += [f"{p:<12}error: {d['error']}" for p, d in summary["policies"].items()
              if "error" in d]
    lines.append("target (issue 3): hybrid TTFT <= -30 % and peak >= +20 % vs lru")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
