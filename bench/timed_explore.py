"""Exploration runs of the timed cluster simulation that ``bench_timed`` does not sweep
(``docs/research/benchmarks-timed.md``).

Two single-point experiments of the timed cluster simulation (4 ``h200-llama3-8b``
replicas, closed loop), printed as one line per policy; each is one run, deterministic for
its seed.

``replayed-belady``: an estimate of the eviction-order head-room in the closed loop. The
``belady`` policy reads next uses from the trace's request order, which the closed loop
does not follow (requests are reordered by queueing and completion times), so it is not an
oracle there. Pass 1 runs ``lru`` and records each request's arrival time; the trace is
reordered by those times and the policies (``belady`` by default) run on it. The second
run's closed loop still moves requests, so the result is an estimate, not a bound.

``weka-sessions``: real WEKA Claude Code sessions (``data/traces/weka_claude_code``),
2N sampled with the seed, 64-token blocks, the whole H200 memory per replica, session
router, N session slots; tool gaps are the sessions' own (capped at 30 minutes, longer ones
are a human away); a turn without a tool call follows after the think time. ``inf`` in the
policy list is ``lru`` with an unbounded cache; ``cachewise-oracle`` gets the true
closed-loop gaps (``anchorage.sim.gaps.closed_loop_gaps_s``).

Usage::

    .venv/bin/python -m bench.timed_explore replayed-belady --tool-gaps weka --slots 256 \
        --seed 1 [--router session] [--policies belady] [--capacity-blocks 8192]
    .venv/bin/python -m bench.timed_explore weka-sessions --slots 32 --seed 1 \
        [--policies lru,hybrid,inf] [--sessions 64]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace

from anchorage.sim.cluster import TimedConfig, simulate_timed
from anchorage.sim.gaps import closed_loop_gaps_s
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from anchorage.workloads import default_traces_dir
from bench import bench_timed

MAX_TOOL_GAP_MS = 1.8e6  # 30 minutes: a longer gap is a human away


def _line(tag: str, res: dict, cpu_s: float) -> str:
    return (f"{tag:<28} hit {res['hit_rate']:.1%}  TTFT mean {res['ttft_mean_s']:.3f} s  "
            f"turns/s {res['throughput_rps']:.3f}  requests {res['measured_requests']}  "
            f"cpu {cpu_s:.0f} s")


def replayed_belady(args) -> int:
    recs, ctxs = bench_timed.workload(args.topology, max(100, 2 * args.slots), args.seed, 64.0,
                                      args.output_scale, args.tool_gaps)
    cfg = bench_timed.timed_config(args.profile, args.replicas, args.slots, args.capacity_blocks)
    c0 = time.process_time()
    sim, res = simulate_timed(recs, ctxs, cfg, "lru", args.router)
    print(_line("lru (pass 1)", res, time.process_time() - c0), flush=True)
    arrival = {r.index: r.arrival_s for r in sim.completed + sim.rejected}
    order = sorted(range(len(recs)), key=lambda i: (arrival.get(i, float("inf")), i))
    recs2 = [recs[i] for i in order]
    ctxs2 = make_contexts(recs2)
    for policy in args.policies.split(","):
        c0 = time.process_time()
        _, res = simulate_timed(recs2, ctxs2, cfg, policy, args.router)
        print(_line(f"{policy} (pass-1 order)", res, time.process_time() - c0), flush=True)
    return 0


def weka_sessions(args) -> int:
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import convert_session, session_files

    files = session_files(args.traces)
    n_sessions = args.sessions or 2 * args.slots
    if n_sessions > len(files):
        print(f"error: {n_sessions} sessions asked, {len(files)} in {args.traces}",
              file=sys.stderr)
        return 2
    next_id = [0]
    recs = []
    for k, path in enumerate(random.Random(args.seed).sample(files, n_sessions)):
        session = convert_session(path, load_json(path), next_id)
        base = session[0].timestamp
        for r in session:  # sessions start k ms apart; the closed loop times their turns
            gap = r.tool_duration_ms
            if gap is not None and gap > MAX_TOOL_GAP_MS:
                gap = MAX_TOOL_GAP_MS
            recs.append(replace(r, timestamp=k * 1000.0 + (r.timestamp - base) * 1e-6,
                                tool_duration_ms=gap))
    recs.sort(key=lambda r: r.timestamp)
    ctxs = make_contexts(recs)
    profile = get_profile(args.profile).with_(block_size=64)
    print(f"WEKA sessions {n_sessions}, requests {len(recs)}, "
          f"{profile.capacity_blocks} blocks of 64 tokens per replica", flush=True)

    def config(capacity=None) -> TimedConfig:
        return TimedConfig(profile, replicas=args.replicas, mode="closed", time_scale=1.0,
                           max_sessions=args.slots, warmup_frac=0.2, capacity_blocks=capacity)

    for policy in args.policies.split(","):
        c0 = time.process_time()
        if policy == "inf":
            _, res = simulate_timed(recs, ctxs, config(10**6), "lru", "session")
        else:
            cfg = config()
            params = ({"next_gap_s": closed_loop_gaps_s(recs, cfg.think_s)}
                      if policy == "cachewise-oracle" else None)
            _, res = simulate_timed(recs, ctxs, cfg, policy, "session", policy_params=params)
        print(_line(policy, res, time.process_time() - c0), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rb = sub.add_parser("replayed-belady", help="two-pass Belady on lru's arrival order")
    rb.add_argument("--tool-gaps", default="generator", choices=["generator", "weka"])
    rb.add_argument("--slots", type=int, required=True, help="concurrent sessions N")
    rb.add_argument("--seed", type=int, default=1)
    rb.add_argument("--router", default="session")
    rb.add_argument("--policies", default="belady")
    rb.add_argument("--topology", default="selector")
    rb.add_argument("--output-scale", type=float, default=0.25)
    rb.add_argument("--capacity-blocks", type=int, default=8192)
    ws = sub.add_parser("weka-sessions", help="real WEKA sessions, closed loop")
    ws.add_argument("--slots", type=int, required=True, help="concurrent sessions N")
    ws.add_argument("--seed", type=int, default=1)
    ws.add_argument("--sessions", type=int, default=0, help="default 2 x slots")
    ws.add_argument("--policies", default="lru,hybrid,inf")
    ws.add_argument("--traces", default=str(default_traces_dir() / "weka_claude_code"),
                    help="WEKA sessions folder (default: $ANCHORAGE_TRACES, else data/traces)")
    for p in (rb, ws):
        p.add_argument("--replicas", type=int, default=4)
        p.add_argument("--profile", default="h200-llama3-8b")
    args = ap.parse_args()
    return replayed_belady(args) if args.cmd == "replayed-belady" else weka_sessions(args)


if __name__ == "__main__":
    sys.exit(main())
