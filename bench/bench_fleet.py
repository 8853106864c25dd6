"""The headline benchmark: Anchorage against the peer stacks, on coding-agent workloads,
with a real memory hierarchy (issue 23), in the timed simulator.

Matrix: workloads (``bench.fleet_workloads``: real WEKA Claude Code sessions, SWE-agent
trajectories, generated multi-agent sessions with WEKA tool gaps, the Mooncake
conversation trace) x stacks (``anchorage.fleet.stacks``: the peers as they ship, Anchorage
and its ablations, the limits) x load x seed, on one node of ``--replicas`` replicas of
``--profile`` with the memory hierarchy of ``anchorage.fleet.hierarchy`` (HBM as vLLM sizes
it, ``--host-gb-per-gpu`` of host DRAM per GPU, ``--link-gbs`` per GPU each way over PCIe
Gen5 x16, ``--gpus-per-link`` GPUs per link).

Load: closed loop of ``load x GPUs`` concurrent sessions (sessions per GPU; session starts
compressed to 1 ms apart so a slot refills as soon as a session ends), each point
simulating ``max(--min-sessions, --sessions-per-slot x slots)`` sessions (WEKA: at most
its 710) drawn with the seed; the metrics cover the steady state (the first 20 % of the
window excluded). Mooncake has no sessions: open loop at ``load`` requests/s per GPU (the
trace's timestamps rescaled). Metrics and summaries: ``anchorage.fleet.run``,
``bench.fleet_report`` (goodput at the SLO, knee, ratios to the best peer and the limit).

Writes ``--out`` (JSON: every run, the summary, the setting, meta), ``--md`` (the tables),
``--plot`` (goodput vs load per stack, one panel per workload). Runs are cached in
``--cache`` (JSON lines, one per finished run): an interrupted matrix resumes; ``--jobs N``
runs them in parallel (``bench.harness``). ``--quick``: a small matrix for the README
(peers, Anchorage, the HBM limit; one seed; three loads; small workloads), under ten
minutes on two cores.

Usage::

    .venv/bin/python -m bench.bench_fleet --quick
    .venv/bin/python -m bench.bench_fleet --workloads weka,swe,gen,mooncake --from-cache \\
        --stacks stock,smg,llm-d,llm-d+offload,dynamo,dynamo+thunderagent,production-stack,continuum,anchorage,limit-hbm,limit-tiers \\
        --cache bench/results/fleet_runs.jsonl   # the committed tables, from the runs
    nice -n 10 .venv/bin/python -m bench.bench_fleet --jobs 2 \\
        --cache bench/results/fleet_runs.jsonl --out bench/results/fleet.json
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from anchorage.fleet.hierarchy import MemoryHierarchy
from anchorage.fleet.run import Setting, run_stack
from anchorage.fleet.spec import get_stack, stack_names
from anchorage.sim.profiles import get_profile
from anchorage.tiering.host_tier import GB
from bench import fleet_report, fleet_workloads, harness

ROLE_ORDER = ("peer", "anchorage", "ablation", "limit", "paper")
PEERS = ["stock", "smg", "llm-d", "llm-d+offload", "llm-d-tiered", "dynamo",
         "dynamo+thunderagent", "production-stack", "continuum"]
# the peers without the prefill cap (``anchorage.fleet.stacks.controls``) and LMCache's sync
# connector: where the cache holds them
CONTROLS = ["production-stack-sync", "stock-no-prefill-cap", "smg-no-prefill-cap",
            "dynamo+thunderagent-no-prefill-cap", "production-stack-sync-no-prefill-cap",
            "continuum-no-prefill-cap"]
FULL_STACKS = PEERS + ["anchorage", "anchorage-no-prefill-cap", "anchorage-own-host",
                       "anchorage-node-pooled",
                       "anchorage-routing", "anchorage-eviction",
                       "anchorage-admission", "anchorage-host", "anchorage-tokencake",
                       "anchorage-tokencake-gate", "anchorage-tokencake-spatial",
                       "anchorage-thunderagent"] + CONTROLS + [
                       "limit-hbm", "limit-host", "limit-tiers"]
QUICK_STACKS = PEERS + ["anchorage", "limit-hbm"]
# per workload: loads swept, replicas, seeds, sessions per slot, sessions at least. CPU
# per run: WEKA 3-25 s, SWE 1-30 s, Mooncake ~10 s; on a 2-core machine at load average
# 20-60 a run takes 5-15x that in wall time, so the committed results hold the headline
# rows only, and at the top loads only the stacks still within the SLO below them
# (``--from-cache`` reports what the cache holds and lists the rest as not run)
LOADS = {"weka": [4, 6, 8, 10, 12, 16, 20], "swe": [64, 128, 192, 256],
         "gen": [100, 200, 250, 300, 350, 400], "mooncake": [0.1, 0.25, 0.5, 1.0, 1.5]}
QUICK_LOADS = {"weka": [4, 8, 12], "swe": [16, 64, 128], "gen": [100, 250, 400],
               "mooncake": [0.25, 0.75, 1.5]}
REPLICAS = {"weka": 8, "swe": 2, "gen": 4, "mooncake": 4}
# seeds of the committed tables (every row; the ablations and limit-host of WEKA and SWE-agent
# at loads 4-12 and 64-256 only; limit-tiers on WEKA and SWE-agent only). Mooncake replays
# the whole trace, which no seed changes: one run per point is its measurement.
SEEDS = {"weka": [1, 2], "swe": [1, 2, 3], "gen": [1, 2], "mooncake": [1]}
PER_SLOT = {"weka": 1.5, "swe": 1.5, "gen": 1.2, "mooncake": 0}
MIN_SESSIONS = {"weka": 64, "swe": 96, "gen": 256, "mooncake": 0}
QUICK_MIN = {"weka": 24, "swe": 48, "gen": 96, "mooncake": 0}
# the ablations run where Anchorage's components have something to act on
FULL_ONLY = {wl: PEERS + ["anchorage", "anchorage-no-prefill-cap", "anchorage-own-host",
                          "anchorage-node-pooled",
                          *CONTROLS,
                          "limit-hbm", "limit-host", "limit-tiers"]
             for wl in ("swe", "gen", "mooncake")}
LOAD_UNIT = {"mooncake": "requests/s per GPU"}
MOONCAKE_RATE = 12031 / 3600.0  # the trace's mean rate, requests/s


def sessions_for(job: dict) -> int:
    if job["workload"] == "mooncake":
        return 0
    slots = int(round(job["load"] * job["gpus"]))
    n = max(job["min_sessions"], int(job["sessions_per_slot"] * slots))
    n = min(n, 710) if job["workload"] == "weka" else n
    if n <= slots:  # every session starts at once: the steady-state window is empty
        raise ValueError(f"{n} sessions for {slots} slots: a closed loop needs more sessions "
                         "than slots (--sessions-per-slot > 1)")
    return n


def setting_of(job: dict, block_size: int) -> Setting:
    prof = get_profile(job["profile"]).with_(block_size=block_size)
    hier = MemoryHierarchy(host_bytes_per_gpu=job["host_gb_per_gpu"] * GB,
                           link_gbs_per_gpu=job["link_gbs"], gpus_per_link=job["gpus_per_link"])
    if job["workload"] == "mooncake":
        rate = job["load"] * job["replicas"] * prof.devices
        return Setting(prof, job["replicas"], mode="open", time_scale=MOONCAKE_RATE / rate,
                       slo_s=job["slo_s"], hierarchy=hier)
    slots = int(round(job["load"] * job["replicas"] * prof.devices))
    # session start times compressed (1 ms apart): a slot refills as soon as it frees
    return Setting(prof, job["replicas"], slots=max(1, slots), slo_s=job["slo_s"],
                   hierarchy=hier, time_scale=1e-3)


def one_run(job: dict) -> dict:
    t0 = time.perf_counter()
    try:
        recs, ctxs, bs = fleet_workloads.load(job["workload"], sessions_for(job), job["seed"])
        res = run_stack(get_stack(job["stack"]), recs, ctxs, setting_of(job, bs))
    except Exception as exc:  # a stack that crashes is reported, not fatal
        return {**job, "error": f"{type(exc).__name__}: {exc}",
                "trace": traceback.format_exc(limit=6)}
    return {**job, **res, "sessions": sessions_for(job), "wall_s": time.perf_counter() - t0}


def make_jobs(args) -> list[dict]:
    prof = get_profile(args.profile)
    jobs = []
    for wl in args.workloads:
        loads = args.loads or (QUICK_LOADS if args.quick else LOADS)[wl]
        reps = args.replicas or (4 if args.quick else REPLICAS[wl])
        seeds = args.seeds or ([1] if args.quick else SEEDS[wl])
        stacks = args.stacks
        if not args.quick and not args.stacks_given and wl in FULL_ONLY:
            stacks = [s for s in stacks if s in FULL_ONLY[wl]]
        # one spelling per load (10, not 10.0: the run cache keys a job by its JSON text)
        loads = [int(x) if float(x).is_integer() else float(x) for x in loads]
        for stack in stacks:
            for load in loads:
                for seed in seeds:
                    jobs.append({
                        "workload": wl, "stack": stack, "load": load, "seed": seed,
                        "profile": args.profile, "replicas": reps,
                        "gpus": reps * prof.devices, "slo_s": args.slo_s,
                        "host_gb_per_gpu": args.host_gb_per_gpu, "link_gbs": args.link_gbs,
                        "gpus_per_link": args.gpus_per_link,
                        "sessions_per_slot": args.sessions_per_slot or PER_SLOT[wl],
                        "min_sessions": (args.min_sessions if args.min_sessions is not None
                                         else (QUICK_MIN if args.quick else MIN_SESSIONS)[wl])})
    # the headline rows first (peers, Anchorage, the HBM limit), seed by seed, workload by
    # workload (issue 18's targets first: WEKA, SWE-agent, Mooncake, generated), so that a
    # matrix cut short has every stack's curve for the first seeds of the first workloads
    first = set(PEERS) | {"anchorage", "limit-hbm"}
    rank = {w: i for i, w in enumerate(("weka", "swe", "mooncake", "gen"))}
    jobs.sort(key=lambda j: (j["stack"] not in first, j["seed"], rank.get(j["workload"], 9),
                             j["load"]))
    return jobs


def order() -> list[str]:
    names = stack_names()
    return sorted(names, key=lambda n: (ROLE_ORDER.index(get_stack(n).role),
                                        FULL_STACKS.index(n) if n in FULL_STACKS else 99))


def report(rows: list[dict], args) -> dict:
    roles = {n: get_stack(n).role for n in stack_names()}
    summary = fleet_report.summarize(rows, args.slo_s, roles)
    prof = get_profile(args.profile)
    hier = MemoryHierarchy(host_bytes_per_gpu=args.host_gb_per_gpu * GB,
                           link_gbs_per_gpu=args.link_gbs, gpus_per_link=args.gpus_per_link)
    doc = {"setting": {"profile": args.profile, "slo_s": args.slo_s,
                       "hierarchy": hier.describe(prof), "quick": args.quick,
                       "replicas": args.replicas or ("4" if args.quick else REPLICAS),
                       "seeds": args.seeds or ([1] if args.quick else SEEDS),
                       "loads": args.loads or (QUICK_LOADS if args.quick else LOADS),
                       "sessions_per_slot": args.sessions_per_slot or PER_SLOT,
                       "min_sessions": args.min_sessions or MIN_SESSIONS},
           "stacks": {n: get_stack(n).describe() for n in args.stacks},
           "summary": summary, "runs": rows, "not_run": getattr(args, "not_run", [])}
    harness.write_json(args.out, doc)
    md = ("## Headline (goodput at the SLO, turns/s per GPU)\n\n" + fleet_report.headline(summary)
          + "\n" + fleet_report.markdown(summary, order(), args.slo_s, LOAD_UNIT))
    Path(args.md).write_text(md)
    if args.plot:
        fleet_report.plot(summary, order(), args.plot, LOAD_UNIT)
    return doc


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", default=",".join(fleet_workloads.WORKLOADS))
    ap.add_argument("--stacks", default=None, help="comma-separated (default: the matrix's)")
    ap.add_argument("--loads", default=None, help="comma-separated, for every workload")
    ap.add_argument("--seeds", default=None,
                    help="comma-separated; default per workload (WEKA, gen 1,2; SWE 1,2,3; "
                         "Mooncake 1: no seed changes it); quick: 1")
    ap.add_argument("--profile", default="h200-llama3-8b")
    ap.add_argument("--replicas", type=int, default=None,
                    help="default per workload (WEKA 8; SWE 2; gen, Mooncake 4); quick: 4")
    ap.add_argument("--slo-s", type=float, default=2.0, help="p90 TTFT target (s)")
    ap.add_argument("--host-gb-per-gpu", type=float, default=256.0)
    ap.add_argument("--link-gbs", type=float, default=50.0, help="per GPU, each way")
    ap.add_argument("--gpus-per-link", type=int, default=1)
    ap.add_argument("--sessions-per-slot", type=float, default=None,
                    help="sessions simulated per slot (> 1: the window is the steady state "
                         "between the ramp-up and the last session's start); default per "
                         "workload (WEKA, SWE 1.5; gen 1.2)")
    ap.add_argument("--min-sessions", type=int, default=None)
    ap.add_argument("--cache", default=None, help="run cache (JSON lines) to resume from")
    ap.add_argument("--from-cache", action="store_true",
                    help="run nothing: report the runs of the matrix that --cache holds")
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--plot", default=None)
    harness.add_fanout_args(ap)
    args = ap.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    for w in args.workloads:
        if w not in fleet_workloads.WORKLOADS:
            ap.error(f"unknown workload {w!r}; known: {', '.join(fleet_workloads.WORKLOADS)}")
    args.stacks_given = bool(args.stacks)
    args.stacks = (args.stacks.split(",") if args.stacks
                   else (QUICK_STACKS if args.quick else FULL_STACKS))
    for s in args.stacks:
        try:
            get_stack(s)
        except ValueError as exc:
            ap.error(str(exc))
    if args.sessions_per_slot is not None and args.sessions_per_slot <= 1:
        ap.error("--sessions-per-slot must be > 1: with one session per slot every session "
                 "starts at once and there is no steady state to measure")
    args.loads = [float(x) for x in args.loads.split(",")] if args.loads else None
    args.seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else None
    tag = "fleet_quick" if args.quick else "fleet"
    args.out = args.out or str(harness.RESULTS / f"{tag}.json")
    args.md = args.md or str(Path(args.out).with_suffix(".md"))
    if args.plot is None:
        args.plot = str(Path(args.out).with_suffix(".png"))
    return args


def main(argv=None) -> int:
    args = parse(argv)
    jobs = make_jobs(args)
    cache = harness.RunCache(args.cache) if args.cache else None
    t0 = time.perf_counter()
    done = [0]
    if args.from_cache:
        if cache is None:
            raise SystemExit("--from-cache needs --cache")
        missing = [j for j in jobs if j not in cache]
        jobs = [j for j in jobs if j in cache]
        print(f"--from-cache: {len(jobs)} runs cached, {len(missing)} of the matrix not run",
              file=sys.stderr)
        args.not_run = [{k: j[k] for k in ("workload", "stack", "load", "seed")}
                        for j in missing]

    def progress(job, res):
        done[0] += 1
        tag = "error" if "error" in res else (f"goodput {res['goodput_per_gpu']:.4f} "
                                              f"p90 {res['ttft_p90_s']:.2f}s "
                                              f"cpu {res['cpu_s']:.0f}s")
        print(f"[{done[0]}/{len(jobs)}] {job['workload']} {job['stack']} load {job['load']:g} "
              f"seed {job['seed']}: {tag}", file=sys.stderr, flush=True)

    rows = harness.run_jobs(harness.importable(one_run), jobs, harness.Fanout.from_args(args),
                            cache=cache, on_result=progress)
    errors = [r for r in rows if "error" in r]
    report(rows, args)
    print(Path(args.md).read_text())
    print(f"{len(rows)} runs ({len(errors)} errors), {time.perf_counter() - t0:.0f} s wall; "
          f"wrote {args.out}, {args.md}, {args.plot}", flush=True)
    for e in errors[:5]:
        print(f"error: {e['workload']} {e['stack']} {e['load']}: {e['error']}", file=sys.stderr)
    return 1 if errors and len(errors) == len(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
