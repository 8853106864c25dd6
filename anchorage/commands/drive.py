"""`anchorage drive`: replay a multi-agent workload against the router as real HTTP traffic.

    anchorage drive --router-url http://127.0.0.1:8000 [--engine-urls URL,URL]
                    [--trace FILE | --topology selector --agents 6 --sessions 24]
                    [--concurrency 8] [--time-compression 50] [--out DIR]

Prompts are token ids built from the trace's block ids (one deterministic random token
block per id), sessions carry x-session-id, tool gaps are replayed scaled down; at the end
a table, a markdown report and PNG plots (hit rate, recomputed prefill, TTFT, turns/s).
"""

from __future__ import annotations

import json
from pathlib import Path


def add_workload_args(p) -> None:
    from anchorage.drive.workload import DEMO

    p.add_argument("--trace", default=None, help="an anchorage-trace/v1 file (Mooncake files too)")
    p.add_argument("--limit", type=int, default=None, help="first N requests of --trace")
    p.add_argument("--topology", default=DEMO["topology"],
                   help=f"generated workload topology (default: {DEMO['topology']})")
    p.add_argument("--agents", type=int, default=DEMO["agents"])
    p.add_argument("--sessions", type=int, default=DEMO["sessions"])
    p.add_argument("--mean-requests", type=float, default=DEMO["mean_requests"],
                   help="mean requests per session")
    p.add_argument("--anchor-tokens", type=int, default=DEMO["anchor_tokens"],
                   help="median anchor (system prompt + tools) length")
    p.add_argument("--seed", type=int, default=DEMO["seed"])
    p.add_argument("--concurrency", type=int, default=6, help="requests in flight at most")
    p.add_argument("--max-sessions", type=int, default=8,
                   help="sessions (agent runs) in flight at most; the next starts when one "
                        "ends (0: every session at its trace time; default 8)")
    p.add_argument("--time-compression", type=float, default=50.0,
                   help="divide the trace's gaps (tool and think time) by this (default 50)")
    p.add_argument("--max-gap", type=float, default=2.0, metavar="SECONDS",
                   help="cap on one replayed gap (default 2 s)")
    p.add_argument("--max-prompt-tokens", type=int, default=4000,
                   help="cut prompts (keeping their prefix) to this many tokens; prompt + "
                        "--max-output-tokens must fit the engines' max model length (default "
                        "4000: the tiny engines' 4096)")
    p.add_argument("--max-output-tokens", type=int, default=8)
    p.add_argument("--vocab", type=int, default=None,
                   help="token ids stay below this (default: the model's vocab_size, else 1024)")
    p.add_argument("--agent-hints", action="store_true",
                   help="send the trace's agent label as anchorage.agent (default: Anchorage "
                        "recognises agents by prompt fingerprint)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="per-request timeout")
    p.add_argument("--prompt-format", choices=["ids", "text", "chat"], default="ids",
                   help="ids: token ids to /v1/completions (default); text: text prompts; chat: "
                        "/v1/chat/completions (engines with a tokenizer, e.g. `anchorage up "
                        "--tiny-model chat`, or gateways that need text)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="model directory whose tokenizer measures text prompts (default: the "
                        "stack's model when it has one, else ~4/3 tokens per word)")


def register(sub) -> None:
    p = sub.add_parser("drive", help="replay a multi-agent workload against the router",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--router-url", default="http://127.0.0.1:8000")
    p.add_argument("--engine-urls", default="",
                   help="comma-separated engine base URLs: hit rate from vLLM's own counters too")
    p.add_argument("--stack", default=None,
                   help="endpoints JSON written by `anchorage up --ready-file` (router and engines)")
    p.add_argument("--model", default="tiny", help="model name in requests (default: tiny)")
    p.add_argument("--name", default="run", help="this run's name in the report")
    p.add_argument("--out", default=None, help="directory for report.md, report.json and plots")
    add_workload_args(p)
    p.set_defaults(func=run)


def load_workload(args, block_size: int = 32):
    from anchorage.cli import CLIError
    from anchorage.drive import workload as wl

    if args.trace:
        if args.limit is not None and args.limit <= 0:
            raise CLIError("--limit must be > 0")
        return wl.from_file(args.trace, args.limit)   # TraceError: one line from the CLI
    try:
        return wl.generated(args.topology, args.agents, args.sessions, args.seed, block_size,
                            args.mean_requests, args.anchor_tokens)
    except ValueError as exc:
        raise CLIError(f"cannot generate the workload: {exc}") from None


def plan_options(args, workload, vocab: int, model: str = "tiny", tokenizer: str | None = None):
    from anchorage.cli import CLIError
    from anchorage.drive.plan import PlanOptions

    if args.concurrency <= 0 or args.time_compression <= 0 or args.max_prompt_tokens <= 0:
        raise CLIError("--concurrency, --time-compression and --max-prompt-tokens must be > 0")
    return PlanOptions(block_size=workload.block_size, vocab=args.vocab or vocab,
                       max_prompt_tokens=args.max_prompt_tokens,
                       max_output_tokens=args.max_output_tokens,
                       time_compression=args.time_compression, max_gap_s=args.max_gap,
                       agent_hints=args.agent_hints, seed=args.seed, model=model,
                       prompt_format=getattr(args, "prompt_format", "ids"),
                       tokenizer=getattr(args, "tokenizer", None) or tokenizer)


def run(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.drive import report
    from anchorage.drive.run import drive

    router, engines = args.router_url, [u for u in args.engine_urls.split(",") if u.strip()]
    sidecars: list[str] = []
    vocab = 1024
    tokenizer = None
    if args.stack:
        try:
            ep = json.loads(Path(args.stack).read_text())
            router, engines, sidecars = ep["router"], ep["engines"], ep.get("sidecars") or []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CLIError(f"--stack {args.stack}: not an endpoints file ({exc})") from None
        from anchorage.stack.tiny_model import has_tokenizer, vocab_size
        vocab = vocab_size(ep.get("model", ""))
        if args.prompt_format != "ids" and has_tokenizer(ep.get("model", "")):
            tokenizer = ep["model"]
    if not router.startswith(("http://", "https://")):
        raise CLIError(f"--router-url must be an http(s) URL, got {router!r}")
    from anchorage.stack.supervisor import http_ok
    base = router.rstrip("/")
    if not (http_ok(base + "/healthz", timeout=5) or http_ok(base + "/health", timeout=5)):
        from anchorage.cli import CommandFailed

        raise CommandFailed(f"no healthy router at {router} (GET /healthz or /health); is "
                            "`anchorage up` running?")
    wl = load_workload(args)
    if not wl.records:
        raise CLIError("the workload has no requests")
    print(f"workload: {wl.description}", flush=True)
    summary, results = drive(router, wl, plan_options(args, wl, vocab, args.model, tokenizer),
                             engines,
                             args.concurrency, args.name, args.timeout,
                             node_agent_urls=sidecars, max_sessions=args.max_sessions)
    print()
    print(report.table({args.name: summary}))
    if args.out:
        paths = report.write(Path(args.out), {args.name: summary}, {args.name: results},
                             "Anchorage drive", [f"Workload: {wl.description}."])
        print(f"\nreport: {paths['markdown']}\nplots: {paths['plots']}")
    return 0 if summary["failed"] == 0 else 1
