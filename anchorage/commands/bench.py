"""`anchorage bench`: the policy comparison suite (hit rate vs capacity per policy).

Runs every policy on every workload at capacities given as fractions of the workload's
unique blocks (plus the half-LRU capacity), prints one table, and optionally writes JSON,
a markdown table and PNG plots.

Contract (``--json`` on stdout, ``--json-out FILE``): ``{"machine", "policies", "rows":
[...]}``; ``--json FILE``, which wrote that file before, still does (deprecated).
"""

from __future__ import annotations

import sys
import time


def register(sub) -> None:
    p = sub.add_parser("bench", help="compare eviction policies across workloads and capacities",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="generated:pipeline,generated:random,mooncake",
                   help="comma-separated: generated:<topology>[:seed], mooncake, "
                        "mooncake-synthetic, chatdev[:seed], weka[:seed], or trace files")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: every registered policy)")
    p.add_argument("--capacities", default="0.01,0.02,0.05,0.1,0.2",
                   help="fractions of unique blocks (default: 0.01,0.02,0.05,0.1,0.2)")
    p.add_argument("--no-half-lru", action="store_true",
                   help="skip the capacity where LRU gets half the infinite-cache rate")
    p.add_argument("--sessions", type=int, default=None,
                   help="sessions per generated workload (default: the generator's)")
    p.add_argument("--traces-dir", default=None,
                   help="folder of the real traces (default: $ANCHORAGE_TRACES, else the "
                        "repository's data/traces)")
    from anchorage.cli import add_json_args

    add_json_args(p, "the results")
    p.add_argument("--markdown", metavar="FILE", help="write the table as markdown")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots of hit rate vs capacity")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from anchorage import bench, workloads
    from anchorage.cli import CLIError, emit_json, json_targets

    to_stdout, json_path = json_targets(args, "bench")
    out = sys.stderr if to_stdout else sys.stdout   # stdout holds only the JSON then
    progress = sys.stderr.isatty()
    from anchorage.policies.registry import policy_names

    known = policy_names()
    policies = ([p.strip() for p in args.policies.split(",") if p.strip()]
                if args.policies else known)
    bad = [p for p in policies if p not in known]
    if bad:
        raise CLIError(f"unknown policy {', '.join(bad)}; known: {', '.join(known)}")
    try:
        fracs = [float(x) for x in args.capacities.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"--capacities must be comma-separated fractions, got {args.capacities!r}")
    if any(not 0 < f <= 1 for f in fracs):
        raise CLIError("--capacities must be fractions in (0, 1]")
    traces_dir = Path(args.traces_dir) if args.traces_dir else None
    loaded = []
    for spec in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        t0 = time.perf_counter()
        try:
            wl = workloads.load(spec, traces_dir, sessions=args.sessions)
        except workloads.WorkloadUnavailable as exc:
            print(f"skipping workload {spec}: {exc}", file=sys.stderr)
            continue
        print(f"workload {wl.name}: {len(wl.contexts)} requests, {wl.unique_blocks} unique "
              f"blocks, infinite-cache hit rate {wl.infinite_hit_rate:.1%} "
              f"(loaded in {time.perf_counter() - t0:.1f}s)", file=sys.stderr)
        loaded.append(wl)
    if not loaded:
        raise CLIError("no workload could be loaded")
    rows = bench.run_suite(loaded, policies, fracs, half_lru=not args.no_half_lru,
                           log=(lambda s: print(s, file=sys.stderr)) if progress else None)
    print(bench.format_rows(rows, policies), file=out)
    emit_json({"machine": bench.machine_description(), "policies": policies,
               "rows": [r.to_json() for r in rows]}, to_stdout, json_path)
    if args.markdown:
        Path(args.markdown).write_text(bench.format_rows(rows, policies, markdown=True) + "\n")
    if args.plots:
        for path in bench.plot_rows(rows, policies, args.plots):
            print(f"plot: {path}", file=sys.stderr)
    return 0
