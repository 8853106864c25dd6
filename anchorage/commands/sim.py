"""`anchorage sim`: replay a trace through the block-pool model under several policies.

Contract (`--json`): one JSON object
``{"trace", "block_size", "capacity_blocks", "requests", "infinite_hit_rate",
"results": [{"policy", "hit_rate", "token_hit_rate", "hit_blocks", "prompt_blocks",
"evictions", "us_per_request", ...}]}``; new fields may be added, none renamed.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay a trace through the block pool under policies",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True, help="anchorage-trace/v1 file (.jsonl[.xz|.gz])")
    cap = p.add_mutually_exclusive_group(required=True)
    cap.add_argument("--capacity-blocks", type=int, help="usable KV blocks in the pool")
    cap.add_argument("--capacity-frac", type=float,
                     help="capacity as a fraction of the trace's unique blocks (e.g. 0.05)")
    p.add_argument("--policies", default="lru,belady",
                   help="comma-separated policy names (default: lru,belady)")
    p.add_argument("--block-size", type=int, default=None,
                   help="tokens per block (default: the trace header's, else 512)")
    p.add_argument("--lenient", action="store_true", help="skip malformed lines (counted)")
    p.add_argument("--no-output-tokens", action="store_true",
                   help="do not allocate/cache blocks for generated tokens")
    p.add_argument("--shared-tenants", action="store_true",
                   help="let tenants share cached prefixes (default: isolated)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.policies.registry import policy_names
    from anchorage.progress import progress_callback
    from anchorage.sim.replay import infinite_hit_rate, make_contexts, run_policies
    from anchorage.trace.format import TraceReader

    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    known = policy_names()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise CLIError(f"unknown policy {', '.join(bad) or '(none)'}; known: {', '.join(known)}")
    if args.block_size is not None and args.block_size <= 0:
        raise CLIError("--block-size must be positive")
    reader = TraceReader(args.trace, lenient=args.lenient, block_size=args.block_size)
    records = list(reader)
    bs = reader.block_size
    if not records:
        raise CLIError(f"{args.trace}: no requests")
    contexts = make_contexts(records, isolate_tenants=not args.shared_tenants)
    unique = len({k for c in contexts for k in c.keys})
    if args.capacity_blocks is not None:
        capacity = args.capacity_blocks
    else:
        if not 0 < args.capacity_frac:
            raise CLIError("--capacity-frac must be > 0")
        capacity = max(1, round(unique * args.capacity_frac))
    if capacity <= 0:
        raise CLIError("--capacity-blocks must be positive")

    def factory(name):
        tick, close = progress_callback(len(contexts), f"sim {name}",
                                        enabled=not args.no_progress)
        closers.append(close)
        return tick

    closers: list = []
    results = run_policies(contexts, capacity, bs, names,
                           include_output=not args.no_output_tokens,
                           progress_factory=factory)
    for c in closers:
        c()
    out = {
        "trace": args.trace, "block_size": bs, "capacity_blocks": capacity,
        "requests": len(records), "unique_blocks": unique,
        "infinite_hit_rate": infinite_hit_rate(contexts, bs),
        "skipped_lines": reader.skipped,
        "results": [r.to_json() for r in results],
    }
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
        return 0
    print(f"trace {args.trace}: {len(records)} requests, block size {bs}, "
          f"{unique} unique blocks, capacity {capacity} blocks "
          f"({capacity / max(unique, 1):.1%}); infinite-cache hit rate "
          f"{out['infinite_hit_rate']:.2%}")
    if reader.skipped:
        print(f"skipped {reader.skipped} malformed lines")
    print(format_table(out["results"]))
    return 0


def format_table(results: list[dict]) -> str:
    head = f"{'policy':<18}{'hit rate':>10}{'token hit':>11}{'hit blocks':>12}" \
           f"{'evictions':>11}{'us/req':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['policy']:<18}{r['hit_rate']:>10.2%}{r['token_hit_rate']:>11.2%}"
                     f"{r['hit_blocks']:>12}{r['evictions']:>11}{r['us_per_request']:>9.1f}")
    return "\n".join(lines)
