"""`anchorage node-agent`: the sidecar next to one vLLM engine (warm-ups, metrics, access log).

    anchorage node-agent --engine-url http://127.0.0.1:8000 --kv-events ipc:///run/anchorage/kv.ipc \
        --state-dir /run/anchorage --listen 127.0.0.1:9400

Reads ANCHORAGE_CONFIG (the operator's ConfigMap mount; re-read when it changes) and
ANCHORAGE_POLICY (the engine's policy, for readiness and policy_info). See docs/node-agent.md.
"""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("node-agent", help="run the node-agent sidecar next to a vLLM engine",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-url", default="http://127.0.0.1:8000",
                   help="the engine's OpenAI server (default: http://127.0.0.1:8000)")
    p.add_argument("--kv-events", default=None,
                   help="the engine's KV event endpoint (vLLM --kv-events-config), e.g. "
                        "ipc:///run/anchorage/kv.ipc; without it anchors are never known cached")
    p.add_argument("--kv-topic", default="kv")
    p.add_argument("--state-dir", default=os.environ.get("ANCHORAGE_STATE_DIR", "/run/anchorage"),
                   help="directory of the plugin's state.json (ANCHORAGE_STATE_DIR)")
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="metrics/health/access-log address (overrides --host/--port)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=9400)
    p.add_argument("--model-name", default=None,
                   help="model_name label and warm-up model (default: the engine's first model)")
    p.add_argument("--no-warmup", action="store_true", help="never issue warm-up requests")
    p.add_argument("--warmup-rate", type=float, default=2.0, help="warm-ups per second (bucket)")
    p.add_argument("--warmup-burst", type=int, default=4)
    p.add_argument("--warmup-cooldown", type=float, default=30.0, metavar="SECONDS",
                   help="minimum time between two warm-ups of one agent")
    p.add_argument("--warmup-r-min", type=float, default=0.3, help="predictability gate")
    p.add_argument("--warmup-min-probability", type=float, default=0.2)
    p.add_argument("--max-running", type=int, default=2,
                   help="warm up only while at most this many requests run")
    p.add_argument("--max-waiting", type=int, default=0)
    p.add_argument("--access-log-sample-rate", type=float, default=0.05,
                   help="fraction of sessions kept in the access log (0 disables it)")
    p.add_argument("--access-log-max-records", type=int, default=100_000)
    p.add_argument("--access-log-max-per-s", type=float, default=50.0)
    p.add_argument("--tick", type=float, default=0.5, metavar="SECONDS")
    p.add_argument("--snapshot-max-age", type=float, default=5.0, metavar="SECONDS",
                   help="a plugin snapshot older than this is stale (not ready)")
    p.add_argument("--snapshot-grace", type=float, default=60.0, metavar="SECONDS",
                   help="with ANCHORAGE_POLICY set and no snapshot this long after the engine "
                        "answers, the engine runs stock: ready anyway")
    p.set_defaults(func=run)


def make_config(args):
    from anchorage.access_log import AccessLogConfig
    from anchorage.cli import CLIError
    from anchorage.warmup import WarmupConfig
    from anchorage.node_agent.sidecar import SidecarConfig

    host, port = args.host, args.port
    if args.listen:
        h, sep, p = args.listen.rpartition(":")
        if not sep or not p.isdigit():
            raise CLIError(f"--listen must be HOST:PORT, got {args.listen!r}")
        host, port = h.strip("[]") or "127.0.0.1", int(p)
    try:
        warm = WarmupConfig(enabled=not args.no_warmup, r_min=args.warmup_r_min,
                            min_probability=args.warmup_min_probability,
                            max_running=args.max_running, max_waiting=args.max_waiting,
                            rate_per_s=args.warmup_rate, burst=args.warmup_burst,
                            cooldown_s=args.warmup_cooldown)
        alog = AccessLogConfig(sample_rate=args.access_log_sample_rate,
                               max_per_s=args.access_log_max_per_s,
                               max_records=args.access_log_max_records)
        return SidecarConfig(
            engine_url=args.engine_url.rstrip("/"), kv_events=args.kv_events,
            kv_topic=args.kv_topic, state_dir=args.state_dir, host=host, port=port,
            model_name=args.model_name, config_path=os.environ.get("ANCHORAGE_CONFIG") or None,
            policy_env=os.environ.get("ANCHORAGE_POLICY") or None, tick_s=args.tick,
            snapshot_max_age_s=args.snapshot_max_age, snapshot_grace_s=args.snapshot_grace,
            warmup=warm, access_log=alog)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def run(args) -> int:
    import asyncio

    from anchorage.cli import CommandFailed
    from anchorage.node_agent.sidecar import Sidecar

    cfg = make_config(args)
    try:
        asyncio.run(Sidecar(cfg).serve())
    except OSError as exc:
        raise CommandFailed(f"cannot listen on {cfg.host}:{cfg.port}: "
                            f"{exc.strerror or exc}") from None
    return 0
