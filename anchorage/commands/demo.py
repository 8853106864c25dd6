"""`anchorage demo`: stock vLLM vs Anchorage on the same multi-agent workload, for real.

Starts the stack (`anchorage up`) with stock vLLM (LRU eviction) behind round-robin
routing, drives the workload through it, stops it; starts it again (cold caches) with the
Anchorage `hybrid` eviction policy behind `agent` routing, drives the same workload, stops
it; prints the side-by-side comparison and writes a markdown report with plots.

The stack binds and connects to loopback only; as root with `unshare` available the whole
run also happens inside a private network namespace, as a second fence; `--isolate off`
runs on the host's loopback. A piece that dies during a run is restarted (`anchorage up`);
its failed requests show in the report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

NETNS_ENV = "ANCHORAGE_DEMO_NETNS"


def register(sub) -> None:
    from anchorage.commands.drive import add_workload_args
    from anchorage.commands.up import add_stack_args

    p = sub.add_parser("demo", help="stock vLLM vs Anchorage on one workload, on this machine",
                       description=__doc__.split("\n\n")[0])
    add_stack_args(p, with_policy=False)
    add_workload_args(p)
    p.add_argument("--configs", default="stock=off/round_robin,anchorage=hybrid/agent",
                   help="NAME=ENGINE_POLICY/ROUTER[@KV_BLOCKS],... run in this order; ROUTER "
                        "smg[:POLICY] is the SGLang gateway (with --tiny-model chat "
                        "--prompt-format chat); @KV_BLOCKS gives that configuration's engines "
                        "their own pool (prompts stay cut to --kv-blocks' length: a larger pool "
                        "is a cache limit on the same workload) "
                        "(default: stock=off/round_robin,anchorage=hybrid/agent)")
    p.add_argument("--out", default="out/demo", help="report directory (default: out/demo)")
    from anchorage.cli import add_json_args

    add_json_args(p, "the figures (summaries, timings)")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="run inside a private network namespace (auto: when root with unshare)")
    p.set_defaults(func=run)


def parse_configs(text: str) -> dict[str, tuple[str, str, int | None]]:
    """``NAME=POLICY/ROUTER[@KV_BLOCKS],...`` -> name -> (policy, router, KV blocks or None:
    the demo's ``--kv-blocks``)."""
    from anchorage.cli import CLIError

    out: dict[str, tuple[str, str, int | None]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, rest = item.partition("=")
        rest, at, blocks = rest.partition("@")
        policy, sep2, router = rest.partition("/")
        if not (sep and sep2 and name and policy and router) or (at and not blocks):
            raise CLIError(f"--configs item {item!r} is not NAME=ENGINE_POLICY/ROUTER[@KV_BLOCKS]")
        if at and not (blocks.isdigit() and int(blocks) >= 2):
            raise CLIError(f"--configs item {item!r}: KV_BLOCKS must be an integer >= 2")
        kv = int(blocks) if at else None
        if name in out:
            raise CLIError(f"--configs names {name!r} twice")
        out[name] = (policy, router, kv)
    if not out:
        raise CLIError("--configs is empty")
    return out


def can_isolate() -> bool:
    return (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("unshare") is not None
            and shutil.which("ip") is not None)


def reexec_isolated(argv: list[str]) -> int:
    """Run this same command inside `unshare -n` with loopback up; returns its status."""
    env = dict(os.environ, **{NETNS_ENV: "1"})
    cmd = ["unshare", "-n", "--", "sh", "-c",
           'ip link set lo up && exec "$0" -m anchorage.cli "$@"', sys.executable, *argv]
    proc = subprocess.Popen(cmd, env=env)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:      # the child got the same Ctrl-C; let it clean up
            continue


def run(args) -> int:
    from anchorage.cli import CLIError, CommandFailed, emit_json, json_targets
    from anchorage.commands.drive import load_workload, plan_options
    from anchorage.commands.up import Stopper, check_dependencies, stack_config, start_stack
    from anchorage.drive import report
    from anchorage.drive.run import drive
    from anchorage.stack.stack import Stack
    from anchorage.stack.supervisor import cpu_used
    from anchorage.stack import gateway
    from anchorage.stack.tiny_model import has_tokenizer, vocab_size

    to_stdout, json_path = json_targets(args, "demo")
    stream = sys.stderr if to_stdout else sys.stdout   # stdout holds only the JSON then

    def say(*parts) -> None:
        print(*parts, file=stream, flush=True)

    configs = parse_configs(args.configs)
    for policy, router, kv in configs.values():  # validate every config before starting anything
        stack_config(args, policy=policy, router=router, kv_blocks=kv)
        if kv and args.model is not None:
            raise CLIError("@KV_BLOCKS sizes the tiny engines' pool; with --model the engines "
                           "size theirs from memory")
        if args.prompt_format != "ids" and args.model is None and args.tiny_model != "chat":
            raise CLIError(f"--prompt-format {args.prompt_format} needs engines with a "
                           "tokenizer: add --tiny-model chat (or --model DIR)")
        if gateway.policy_of(router) is not None and args.prompt_format == "ids":
            raise CLIError(f"router {router}: the SGLang gateway takes text only: add "
                           "--prompt-format chat (or text) and --tiny-model chat")
    check_dependencies()
    isolated = os.environ.get(NETNS_ENV) == "1"
    if not isolated and (args.isolate == "on" or (args.isolate == "auto" and can_isolate())):
        if not can_isolate():
            raise CLIError("--isolate on needs root with unshare and ip")
        say("running inside a private network namespace (loopback only)")
        return reexec_isolated(sys.argv[1:] if sys.argv[0].endswith(("anchorage", "cli.py"))
                               else ["demo", *sys.argv[2:]])
    wl = load_workload(args, args.block_size)
    say(f"workload: {wl.description}")
    summaries, runs, timings, cpu = {}, {}, {}, {}
    # every configuration gets the same prompts: cut to fit the smallest engine's length
    kv_min = min(kv or args.kv_blocks for _, _, kv in configs.values())
    t_all = time.monotonic()
    with Stopper():
        for k, (name, (policy, router, kv)) in enumerate(configs.items(), 1):
            say(f"\n[{k}/{len(configs)}] {name}: engine policy {policy}, routing {router}"
                + (f", {kv} KV blocks per engine" if kv else ""))
            stack = Stack(stack_config(args, policy=policy, router=router, kv_blocks=kv))
            t0 = time.monotonic()
            try:
                ep = start_stack(stack, say)
                t_up = time.monotonic() - t0
                tokenizer = (ep.model if args.prompt_format != "ids" and has_tokenizer(ep.model)
                             else None)
                opts = plan_options(args, wl, vocab_size(ep.model), tokenizer=tokenizer)
                if args.model is None:  # the tiny engines' max model length bounds prompts
                    cap = (kv_min // 2) * args.block_size - opts.max_output_tokens
                    opts = replace(opts, max_prompt_tokens=min(opts.max_prompt_tokens, cap))
                cpu0 = stack.sup.cpu()
                summaries[name], runs[name] = drive(ep.router, wl, opts, ep.engines,
                                                    args.concurrency, name, args.timeout,
                                                    node_agent_urls=ep.sidecars, say=say,
                                                    max_sessions=args.max_sessions)
                cpu[name] = cpu_used(cpu0, stack.sup.cpu())
                summaries[name].update(report.cpu_summary(cpu[name], summaries[name]))
                problem = stack.check()
                if problem:
                    raise CommandFailed(problem)
            except KeyboardInterrupt:
                print("\ninterrupted; stopping the stack ...", file=sys.stderr, flush=True)
                stack.stop()
                return 130
            finally:
                stack.stop()
            timings[name] = {"start_s": round(t_up, 1), "total_s": round(time.monotonic() - t0, 1)}
            say(f"  {name} stack stopped")
    say("\n" + report.table(summaries) + "\n")
    notes = [f"Workload: {wl.description}; concurrency {args.concurrency}, time compression "
             f"{args.time_compression:g}x, at most {args.max_sessions} sessions at once, {args.engines} engines x {args.kv_blocks} KV blocks of "
             f"{args.block_size} tokens.",
             "Configurations: " + "; ".join(f"**{n}** = engine policy `{p}`, routing `{r}`"
                                             + (f", {kv} KV blocks per engine" if kv else "")
                                             for n, (p, r, kv) in configs.items()) + "."]
    extra = {"workload": wl.description,
             "configs": {n: {"policy": p, "router": r, "kv_blocks": kv or args.kv_blocks}
                         for n, (p, r, kv) in configs.items()},
             "timings": timings, "cpu_s": cpu, "engines": args.engines, "kv_blocks": args.kv_blocks,
             "block_size": args.block_size, "concurrency": args.concurrency,
             "time_compression": args.time_compression, "max_sessions": args.max_sessions, "wall_s": time.monotonic() - t_all}
    paths = report.write(Path(args.out), summaries, runs, "Anchorage demo: stock vs Anchorage",
                         notes, extra)
    emit_json({"summaries": summaries, **extra}, to_stdout, json_path, default=str)
    say(f"report: {paths['markdown']}\nplots: {paths['plots']}")
    failed = sum(s["failed"] for s in summaries.values())
    if failed:
        print(f"{failed} request(s) failed (see the report)", file=sys.stderr)
        return 1
    return 0
