"""`anchorage trace`: generate, convert and describe anchorage-trace/v1 files.

    anchorage trace generate --topology T --agents N --sessions N --seed S [-o FILE]
                             [--block-size B] [--mean-requests R] [--concurrency C]
                             [--tenants K]
    anchorage trace convert --from DATASET SRC -o OUT [--seed S] [--window-s W]
                            [--time-compression X] [--block-size B] [--limit N]
    anchorage trace stats FILE [--json] [--lenient] [--sample N]

Output files are compressed by suffix (.xz, .gz). Errors are one line, exit status 2.
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("trace", help="generate, convert and describe traces",
                       description=__doc__.split("\n\n")[0])
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: _usage(p))

    from anchorage.trace.generate import TOPOLOGIES

    g = tsub.add_parser("generate", help="synthetic multi-agent workload with a known topology")
    g.add_argument("--topology", required=True, choices=TOPOLOGIES)
    g.add_argument("--agents", type=int, required=True, help="number of agents")
    g.add_argument("--sessions", type=int, required=True, help="number of sessions")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("-o", "--output", help="output file (.jsonl[.xz|.gz]); stdout if absent")
    g.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    g.add_argument("--mean-requests", type=float, default=16.0,
                   help="mean requests per session (default 16)")
    g.add_argument("--concurrency", type=float, default=64.0,
                   help="sessions running at once, on average (default 64)")
    g.add_argument("--tenants", type=int, default=0, help="tenants (default 0: none)")
    g.set_defaults(func=run_generate)

    c = tsub.add_parser("convert", help="convert a public dataset into anchorage-trace/v1")
    from anchorage.trace.convert import CONVERTERS
    c.add_argument("--from", dest="dataset", required=True, choices=sorted(CONVERTERS))
    c.add_argument("src", help="the dataset's file or folder")
    c.add_argument("-o", "--output", required=True, help="output file (.jsonl[.xz|.gz])")
    c.add_argument("--seed", type=int, default=0, help="seed for session start offsets")
    c.add_argument("--window-s", type=float, default=None,
                   help="interleave sessions with random start offsets over this window "
                        "(weka, chatdev, swe-agent, tracelab)")
    c.add_argument("--time-compression", type=float, default=None,
                   help="chatdev: divide the original clock by this factor instead")
    c.add_argument("--block-size", type=int, default=None,
                   help="block size for text/positional/arrival hashing "
                        "(swe-agent, tracelab, azure; default 16)")
    c.add_argument("--limit", type=int, default=None, help="convert at most N sessions/requests")
    c.set_defaults(func=run_convert)

    s = tsub.add_parser("stats", help="requests, sessions, agents, reuse and hit rates")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--lenient", action="store_true", help="skip malformed lines (counted)")
    s.add_argument("--block-size", type=int, default=None, help="override the header's")
    s.add_argument("--sample", type=int, default=None,
                   help="reuse distances over at most N sampled accesses (default: all "
                        "up to 20M accesses)")
    s.set_defaults(func=run_stats)


def _usage(parser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _open_out(path: str | None):
    from anchorage.trace.format import open_text

    if path is None or path == "-":
        return sys.stdout, False
    try:
        return open_text(path, "w"), True
    except OSError as exc:
        from anchorage.cli import CLIError
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None


def run_generate(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.trace.format import dump_trace
    from anchorage.trace.generate import generate

    try:
        header, records = generate(args.topology, args.agents, args.sessions, args.seed,
                                   block_size=args.block_size,
                                   mean_requests=args.mean_requests,
                                   concurrency=args.concurrency, tenants=args.tenants)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    fh, close = _open_out(args.output)
    try:
        dump_trace(fh, records, header)
    finally:
        if close:
            fh.close()
    if args.output:
        print(f"wrote {len(records)} requests ({args.sessions} sessions, "
              f"{args.topology}) to {args.output}", file=sys.stderr)
    return 0


def run_convert(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.trace.convert import ConvertOptions, convert
    from anchorage.trace.format import write_trace

    opts = ConvertOptions(seed=args.seed, window_s=args.window_s,
                          time_compression=args.time_compression,
                          block_size=args.block_size, limit=args.limit)
    try:
        opts.validate()
        header, records = convert(args.dataset, args.src, opts)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        n = write_trace(args.output, records, header)
    except OSError as exc:
        raise CLIError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    sessions = len({r.session_id for r in records if r.session_id is not None})
    print(f"wrote {n} requests ({sessions} sessions) from {args.dataset} to {args.output}",
          file=sys.stderr)
    return 0


def run_stats(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.trace.stats import format_stats, trace_stats

    if args.block_size is not None and args.block_size <= 0:
        raise CLIError("--block-size must be positive")
    if args.sample is not None and args.sample <= 0:
        raise CLIError("--sample must be positive")
    out = trace_stats(args.file, lenient=args.lenient, block_size=args.block_size,
                      sample=args.sample)
    if args.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_stats(out))
    return 0
