"""Stall-aware tiering (TokenCake, issue 9) in the timed simulator: mean end-to-end session
latency and transfer volume of ``tokencake`` vs ``hybrid`` without tiering and vs naive
offload-on-every-stall, at several session arrival rates, plus the tool-time noise study.

Setup: one ``h200-llama3-8b`` replica (sessions are sticky; one replica is what the policy
decides over), ``hybrid`` eviction in every run, a host tier of 100 GB at 25 GB/s each way
(``anchorage.tiering.host_tier`` defaults). Sessions arrive as a Poisson process at rate
``lambda`` (sessions/s, seeded); each session's turns are closed-loop (the next turn
arrives when the previous one completed plus its tool time, or 0.3 s think time).
Clients label agents (``agent_hint`` = the trace's agent; TokenCake reads the agent graph
from the application). Workloads:

- ``weka``: WEKA Claude Code sessions (``weka_claude_code`` under ``data/traces`` or
  ``$ANCHORAGE_TRACES``, converter ``anchorage.trace.convert.weka``), a seeded sample,
  64-token blocks; KV capacity ``--weka-kv-gib`` (default 40 GiB);
- ``gen``: the generator's ``selector`` multi-agent topology (6 agents, tool calls with
  per-tool latencies), 16-token blocks; KV capacity ``--gen-kv-gib`` (default 16 GiB, as
  ``bench_timed``).

Metrics per run: ``session_time_mean_s`` (first request arrival to last completion, mean
over sessions), GPU hit rate, host hit rate, offloads, reloads by outcome, bytes moved.
Targets: tokencake's mean session latency >= 20 % below hybrid without tiering, and its
bytes moved <= 50 % of naive's (the paper: -47 % and 51 % less swap). Noise study
(``--noise``): every tool duration multiplied by U[1 - s, 1 + s] (seeded), s in 0, 0.25,
0.5, at the middle rate; tokencake vs hybrid. ``--quick``: fewer sessions, two rates.

``naive`` is the paper's plain offload: every tool stall swaps the whole context out (all
its GPU blocks copied) and back in at the tool's return. ``naive-incremental`` (run at the
middle rate, for the analysis) copies only blocks host memory lacks, as tokencake does.

``--saving-ratios r1,r2``: the latency/bytes frontier of the benefit-per-byte test, extra
tokencake runs at the middle rate with ``GateParams(min_saving_ratio=r)`` (a reload must
save ``r`` times its link time in prefill compute; the default 1 is the break-even);
reported apart (``frontier`` in the JSON), against the same ``off`` and ``naive`` runs.

Usage::

    .venv/bin/python -m bench.bench_tiering [--quick] [--workloads weka,gen]
        [--saving-ratios 6,6.5] [--jobs 2] [--ray-address ADDR] [--out bench/results/tiering.json]

``--jobs N`` / ``--ray-address`` run the runs as Ray tasks (``bench.harness``).
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from dataclasses import replace

from anchorage.sim.cluster import TimedConfig
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from anchorage.tiering.host_tier import block_bytes
from anchorage.tiering.sim import TieringConfig, run_tiered
from anchorage.tiering.temporal import GateParams
from anchorage.workloads import trace_path
from bench import harness

GIB = 1024 ** 3
MODES = ("off", "tokencake", "naive")
_WL: dict = {}


def weka_records(sessions: int, seed: int):
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import convert_session, session_files
    files = session_files(str(trace_path("weka_claude_code")))
    pick = random.Random(seed).sample(files, min(sessions, len(files)))
    next_id = [0]
    return [convert_session(f, load_json(f), next_id) for f in pick], 64


def gen_records(sessions: int, seed: int):
    from anchorage.trace.generate import generate
    _, recs = generate("selector", 6, sessions, seed, concurrency=64)
    by: dict = {}
    for r in recs:
        by.setdefault(r.session_id, []).append(r)
    return list(by.values()), 16


def arrange(sessions, rate: float, seed: int, noise: float):
    """Sessions start as a Poisson process of ``rate``/s; turns keep their order (the
    closed loop times them); tool durations get multiplicative noise U[1-s, 1+s]."""
    rng = random.Random(f"arrivals:{seed}")
    nrng = random.Random(f"noise:{seed}:{noise}")
    out = []
    t = 0.0
    for sess in sessions:
        t += rng.expovariate(rate)
        base = sess[0].timestamp
        for r in sess:
            d = r.tool_duration_ms
            if d is not None and noise > 0:
                d = d * nrng.uniform(1 - noise, 1 + noise)
            out.append(replace(r, timestamp=t * 1000.0 + (r.timestamp - base) * 1e-6,
                               tool_duration_ms=d))
    out.sort(key=lambda r: r.timestamp)
    return out


def load(job: dict):
    key = (job["workload"], job["sessions"], job["seed"])
    if key not in _WL:
        fn = weka_records if job["workload"] == "weka" else gen_records
        _WL[key] = fn(job["sessions"], job["seed"])
    sessions, bs = _WL[key]
    recs = arrange(sessions, job["rate"], job["seed"], job["noise"])
    ctxs = make_contexts(recs)
    for c, r in zip(ctxs, recs):
        c.agent_hint = r.agent
    return recs, ctxs, bs


def one_run(job: dict) -> dict:
    recs, ctxs, bs = load(job)
    prof = get_profile("h200-llama3-8b").with_(block_size=bs)
    cap = int(job["kv_gib"] * GIB // block_bytes(prof.model, bs))
    cfg = TimedConfig(prof, replicas=1, mode="closed", capacity_blocks=cap)
    t0 = time.perf_counter()
    try:
        gate = GateParams(min_saving_ratio=job.get("saving_ratio") or 1.0)
        res = run_tiered(recs, ctxs, cfg, "hybrid", "session",
                         tiering=TieringConfig(mode=job["mode"], gate=gate))
    except Exception as exc:  # reported, not fatal
        return {**job, "error": f"{type(exc).__name__}: {exc}"}
    res.pop("per_replica", None)
    keep = ("session_time_mean_s", "session_time_p90_s", "latency_mean_s", "ttft_mean_s",
            "queue_mean_s",
            "hit_rate", "host_hit_rate", "recomputed_tokens", "preemptions", "requests",
            "rejected", "throughput_rps", "makespan_s", "offloads", "offload_blocks",
            "reloads", "reload_blocks", "demand_reloads", "offload_bytes", "reload_bytes",
            "bytes_moved", "outcomes", "gate", "actions", "reserved_blocks", "capacity_blocks",
            "host_hit_blocks", "prompt_blocks", "hit_blocks")
    return {**job, **{k: res.get(k) for k in keep},
            "wall_s": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="weka,gen")
    ap.add_argument("--weka-sessions", type=int, default=24)
    ap.add_argument("--weka-rates", default="0.01,0.03,0.1", help="sessions/s")
    ap.add_argument("--weka-kv-gib", type=float, default=40.0)
    ap.add_argument("--gen-sessions", type=int, default=240)
    ap.add_argument("--gen-rates", default="1,2,4", help="sessions/s")
    ap.add_argument("--gen-kv-gib", type=float, default=16.0)
    ap.add_argument("--noise", default="0,0.25,0.5")
    ap.add_argument("--saving-ratios", default="",
                    help="extra tokencake runs at the middle rate, one per min_saving_ratio")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(harness.RESULTS / "tiering.json"))
    harness.add_fanout_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.weka_sessions, args.gen_sessions = 8, 80
        args.weka_rates, args.gen_rates = "0.01,0.1", "1,4"
    jobs = []
    for wl in [w for w in args.workloads.split(",") if w]:
        if wl not in ("weka", "gen"):
            print(f"unknown workload {wl!r} (weka, gen)", file=sys.stderr)
            return 2
        rates = [float(x) for x in getattr(args, f"{wl}_rates").split(",")]
        common = dict(workload=wl, sessions=getattr(args, f"{wl}_sessions"), seed=args.seed,
                      kv_gib=getattr(args, f"{wl}_kv_gib"))
        for rate in rates:
            for mode in MODES:
                jobs.append(dict(common, rate=rate, mode=mode, noise=0.0))
            if rate == rates[len(rates) // 2]:  # the dedup baseline, for the analysis
                jobs.append(dict(common, rate=rate, mode="naive-incremental", noise=0.0))
        mid = rates[len(rates) // 2]
        for ratio in [float(x) for x in args.saving_ratios.split(",") if x.strip()]:
            jobs.append(dict(common, rate=mid, mode="tokencake", noise=0.0,
                             saving_ratio=ratio))
        for s in [float(x) for x in args.noise.split(",") if float(x) > 0]:
            for mode in ("off", "tokencake"):
                jobs.append(dict(common, rate=mid, mode=mode, noise=s))
    t0 = time.perf_counter()
    runs = harness.run_jobs(one_run, jobs, harness.Fanout.from_args(args), on_result=progress)
    summary = summarize(runs)
    print(format_table(summary))
    frontier = summarize_frontier(runs)
    if frontier:
        print(format_frontier(frontier))
    out = {"bench": "tiering", "profile": "h200-llama3-8b", "policy": "hybrid",
           "router": "session", "replicas": 1, "args": vars(args),
           "machine": platform.node(), "wall_s": time.perf_counter() - t0,
           "summary": summary, "frontier": frontier, "runs": runs}
    harness.write_json(args.out, out)
    print(f"wrote {args.out}")
    return 0


def progress(j: dict, r: dict) -> None:
    print(f"  {j['workload']:<5} rate {j['rate']:<5} noise {j['noise']:<4} "
          f"{j['mode']:<10} " + (r["error"] if "error" in r else
                                 f"ratio {j.get('saving_ratio') or 1:g}  "
                                 f"session {r['session_time_mean_s']:.1f}s  "
                                 f"moved {r['bytes_moved'] or 0:.3g} B  "
                                 f"({r['wall_s']:.0f}s)"), flush=True)


def summarize_frontier(runs: list[dict]) -> list[dict]:
    """The default tokencake run and each ``--saving-ratios`` run against ``off`` and
    ``naive`` at the same rate (noise 0)."""
    base = {(r["workload"], r["rate"], r["mode"]): r for r in runs
            if r["noise"] == 0 and not r.get("saving_ratio") and "error" not in r}
    extra = [r for r in runs if r.get("saving_ratio") and "error" not in r]
    rows = []
    for r in sorted(extra + [base[k] for k in {(x["workload"], x["rate"], "tokencake")
                                                for x in extra} if k in base],
                    key=lambda r: (r["workload"], r.get("saving_ratio") or 1.0)):
        off = base.get((r["workload"], r["rate"], "off"))
        naive = base.get((r["workload"], r["rate"], "naive"))
        if off is None or naive is None or not naive["bytes_moved"]:
            continue
        rows.append({"workload": r["workload"], "rate": r["rate"],
                     "min_saving_ratio": r.get("saving_ratio") or 1.0,
                     "session_s": r["session_time_mean_s"],
                     "latency_reduction": 1 - r["session_time_mean_s"]
                     / off["session_time_mean_s"],
                     "bytes_ratio": r["bytes_moved"] / naive["bytes_moved"],
                     "host_hit_rate": r["host_hit_rate"], "gate": r["gate"]})
    return rows


def format_frontier(rows: list[dict]) -> str:
    C = harness.Column
    return "benefit-per-byte frontier (tokencake, middle rate):\n" + harness.table([
        C("workload", "workload", width=9, align="<"), C("rate/s", "rate", width=7),
        C("ratio", "min_saving_ratio", "g", 7), C("session s", "session_s", ".1f", 11),
        C("latency", lambda r: -r["latency_reduction"], "+.1%", 9),
        C("bytes vs naive", "bytes_ratio", ".3f", 15),
        C("host hit", "host_hit_rate", ".1%", 9)], rows, sep="")


def summarize(runs: list[dict]) -> list[dict]:
    by = {(r["workload"], r["rate"], r["noise"], r["mode"]): r for r in runs
          if not r.get("saving_ratio")}
    rows = []
    for (wl, rate, noise, mode), r in sorted(by.items(), key=lambda kv: kv[0][:3]):
        if mode != "tokencake":
            continue
        off = by.get((wl, rate, noise, "off"))
        naive = by.get((wl, rate, noise, "naive"))
        row = {"workload": wl, "rate": rate, "noise": noise}
        if any(x is None or "error" in x for x in (r, off)):
            row["error"] = next((x.get("error") for x in (r, off) if x and "error" in x),
                                "missing run")
            rows.append(row)
            continue
        row.update({
            "session_s_off": off["session_time_mean_s"],
            "session_s_tokencake": r["session_time_mean_s"],
            "latency_reduction": 1 - r["session_time_mean_s"] / off["session_time_mean_s"],
            "hit_rate_off": off["hit_rate"], "hit_rate_tokencake": r["hit_rate"],
            "host_hit_rate_tokencake": r["host_hit_rate"],
            "bytes_tokencake": r["bytes_moved"], "outcomes_tokencake": r["outcomes"],
        })
        if naive is not None and "error" not in naive:
            row.update({
                "session_s_naive": naive["session_time_mean_s"],
                "bytes_naive": naive["bytes_moved"],
                "bytes_ratio": (r["bytes_moved"] / naive["bytes_moved"]
                                if naive["bytes_moved"] else None),
                "host_hit_rate_naive": naive["host_hit_rate"],
            })
            inc = by.get((wl, rate, noise, "naive-incremental"))
            if inc is not None and "error" not in inc and inc["bytes_moved"]:
                row["session_s_naive_incremental"] = inc["session_time_mean_s"]
                row["bytes_ratio_vs_incremental"] = r["bytes_moved"] / inc["bytes_moved"]
            row["targets_met"] = (row["latency_reduction"] >= 0.20
                                  and row["bytes_ratio"] is not None
                                  and row["bytes_ratio"] <= 0.5)
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    C = harness.Column
    ok = [r for r in rows if "error" not in r]
    lines = [harness.table([
        C("workload", "workload", width=9, align="<"), C("rate/s", "rate", width=7),
        C("noise", "noise", width=6), C("off s", "session_s_off", ".1f", 9),
        C("tokencake s", "session_s_tokencake", ".1f", 12),
        C("naive s", lambda r: r.get("session_s_naive"), ".1f", 9),
        C("latency", lambda r: -r["latency_reduction"], "+.1%", 9),
        C("bytes vs naive", lambda r: r.get("bytes_ratio"), ".2f", 15),
        C("host hit", "host_hit_rate_tokencake", ".1%", 9),
        C("  targets", lambda r: "" if "targets_met" not in r else
          "  met" if r["targets_met"] else "  missed", align="<")],
        ok, sep="", rule=True)]
    lines += [f"{r['workload']:<9}{r['rate']:>7}{r['noise']:>6}  error: {r['error']}"
              for r in rows if "error" in r]
    lines.append("targets: tokencake session latency <= -20 % vs hybrid without tiering; "
                 "bytes moved <= 0.5 x naive")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
