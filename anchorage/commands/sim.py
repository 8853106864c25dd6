"""`anchorage sim`: replay a trace through the block-pool model under several policies.

Contract (`--json`): one JSON object
``{"trace", "block_size", "capacity_blocks", "requests", "infinite_hit_rate",
"results": [{"policy", "hit_rate", "token_hit_rate", "hit_blocks", "prompt_blocks",
"evictions", "us_per_request", ...}]}``; new fields may be added, none renamed.

``--mode timed`` runs the discrete-event cluster simulator (``anchorage.sim.cluster``):
``--replicas R --router NAME[,NAME..] --profile NAME``; the same object gains ``mode``,
``profile``, ``replicas``, ``router`` and each ``results`` entry (one per router and
policy) gains ``router``, ``replicas``, ``ttft_p50_s``/``ttft_p90_s``/``ttft_p99_s``,
``ttft_mean_s``, latency percentiles, ``throughput_rps``, ``recomputed_tokens``,
``preemptions``, ``session_time_mean_s``, ``per_replica`` (list) and, when ``belady`` ran,
``belady_gap`` (Belady's hit rate minus this one); ``hit_rate`` stays fleet-wide.
``--router pooled`` is one cache of the fleet's total size (the placement reference).
``--profile`` takes a profile name or a calibration file (``anchorage-calibration/v1``,
``scripts/gpu/calibrate.py``); ``--calibration FILE`` loads one explicitly (its base profile
must be ``--profile``'s, when that is given). The object then also has ``profile_source``
(``"derived: ..."`` or ``"measured: <file> ..."``) and ``calibration`` (the file, or null).

``--tiering naive|temporal|tokencake`` gives every replica a host-memory KV tier
(``anchorage.tiering``; ``--host-tier-gb``, ``--host-bw-gbs`` each way,
``--offload-watermark``); each result then also has ``host_hit_rate``,
``host_hit_blocks``, ``offloads``, ``reloads``, ``outcomes`` (reloads in time / late /
wasted), ``offload_bytes``, ``reload_bytes``, ``bytes_moved``, ``gate`` (decisions by
reason), ``actions`` (offload / backup / hold), ``reserved_blocks`` and ``tiering``. ``--agent-hints`` passes the trace's agent
labels as client metadata (the spatial policy's agents).
"""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("sim", help="replay a trace through the block pool under policies",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True, help="anchorage-trace/v1 file (.jsonl[.xz|.gz])")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity-blocks", type=int,
                     help="usable KV blocks in the pool (per replica in timed mode; "
                          "default there: the profile's)")
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
    p.add_argument("--param", action="append", default=[], metavar="POLICY.KEY=VALUE",
                   help="policy parameter, e.g. ttl.ttl_s=2 (repeatable)")
    t = p.add_argument_group("timed mode (--mode timed)")
    t.add_argument("--mode", choices=["sequential", "timed"], default="sequential",
                   help="sequential replay (default) or the discrete-event cluster simulator")
    t.add_argument("--replicas", type=int, default=1, help="replicas (default 1)")
    t.add_argument("--router", default="round_robin",
                   help="router name(s), comma-separated, from anchorage.routing, or "
                        "'pooled' (default round_robin)")
    t.add_argument("--router-param", action="append", default=[], metavar="KEY=VALUE",
                   help="router parameter (repeatable)")
    t.add_argument("--profile", default=None,
                   help="hardware profile name, or a calibration file (.json) "
                        "(default h200-llama3-8b)")
    t.add_argument("--calibration", "--profile-file", dest="calibration", default=None,
                   metavar="FILE",
                   help="calibration JSON (scripts/gpu/calibrate.py): its base profile "
                        "with the measured coefficients")
    t.add_argument("--arrivals", choices=["open", "closed"], default="closed",
                   help="open: trace timestamps; closed: a session's next request after "
                        "completion + tool time or think time (default)")
    t.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply trace timestamps (0.5 = twice the arrival rate)")
    t.add_argument("--think-s", type=float, default=0.3,
                   help="closed-loop gap after a turn without a tool call (default 0.3)")
    t.add_argument("--warmup-s", type=float, default=0.0,
                   help="requests arriving before this are run but not measured")
    t.add_argument("--max-sessions", type=int, default=None,
                   help="closed loop: N concurrent session slots (a session starts when "
                        "a slot frees); metrics cover the steady state")
    t.add_argument("--admission", choices=["fcfs", "prefix-aware"], default="fcfs",
                   help="replica admission order: fcfs (vLLM's default) or prefix-aware "
                        "(fewest new blocks first, aged; ANCHORAGE_SCHEDULER=prefix-aware)")
    t.add_argument("--admission-ttft-target", type=float, default=2.0, metavar="S",
                   help="prefix-aware admission's TTFT target in seconds (default 2, as "
                        "the engine's ANCHORAGE_ADMISSION_TTFT_TARGET_S; 0: none)")
    tt = p.add_argument_group("host-memory tier (timed mode)")
    tt.add_argument("--tiering", choices=["off", "naive", "naive-incremental", "temporal", "tokencake"],
                    default="off",
                    help="stall-aware KV offload to host memory (default off)")
    tt.add_argument("--host-tier-gb", type=float, default=100.0,
                    help="host tier capacity per replica in GB (default 100)")
    tt.add_argument("--host-bw-gbs", type=float, default=None,
                    help="host link bandwidth each way in GB/s (default: the profile's "
                         "measured link, else 25)")
    tt.add_argument("--offload-watermark", type=float, default=None,
                    help="GPU memory pressure below which offloads are rejected (0.5)")
    tt.add_argument("--agent-hints", action="store_true",
                    help="use the trace's agent labels as client agent metadata")
    p.set_defaults(func=run)


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    return text


def parse_params(items: list[str], *, scoped: bool) -> dict:
    """``POLICY.KEY=VALUE`` (scoped) or ``KEY=VALUE`` strings into dicts; CLIError if bad."""
    from anchorage.cli import CLIError

    out: dict = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise CLIError(f"bad parameter {item!r}: expected {'POLICY.' if scoped else ''}KEY=VALUE")
        if scoped:
            pol, dot, k = key.partition(".")
            if not dot or not pol or not k:
                raise CLIError(f"bad parameter {item!r}: expected POLICY.KEY=VALUE")
            out.setdefault(pol, {})[k] = _value(val)
        else:
            out[key] = _value(val)
    return out


def run(args) -> int:
    from anchorage.cli import CLIError
    from anchorage.progress import progress_callback
    from anchorage.sim.replay import infinite_hit_rate, make_contexts, run_policies
    from anchorage.trace.format import TraceReader

    names, params = _check_args(args)
    reader = TraceReader(args.trace, lenient=args.lenient, block_size=args.block_size)
    records = list(reader)
    bs = reader.block_size
    if not records:
        raise CLIError(f"{args.trace}: no requests")
    contexts = make_contexts(records, isolate_tenants=not args.shared_tenants)
    unique = len({k for c in contexts for k in c.keys})
    capacity = _capacity(args, unique)
    if args.mode == "timed":
        return run_timed_mode(args, records, contexts, bs, capacity, names, params, unique,
                              reader.skipped)

    def factory(name):
        tick, close = progress_callback(len(contexts), f"sim {name}",
                                        enabled=not args.no_progress)
        closers.append(close)
        return tick

    closers: list = []
    try:
        results = run_policies(contexts, capacity, bs, names, params=params,
                               include_output=not args.no_output_tokens,
                               progress_factory=factory)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"bad policy parameters: {exc}") from None
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


def _check_args(args) -> tuple[list[str], dict]:
    """The policy names and their parameters; a clear error for each bad flag."""
    from anchorage.cli import CLIError
    from anchorage.policies.registry import policy_names

    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    known = policy_names()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise CLIError(f"unknown policy {', '.join(bad) or '(none)'}; known: {', '.join(known)}")
    if args.block_size is not None and args.block_size <= 0:
        raise CLIError("--block-size must be positive")
    params = parse_params(args.param, scoped=True)
    if args.tiering != "off" and args.mode != "timed":
        raise CLIError("--tiering needs --mode timed")
    if args.mode == "sequential" and args.capacity_blocks is None and args.capacity_frac is None:
        raise CLIError("one of --capacity-blocks or --capacity-frac is required")
    return names, params


def _capacity(args, unique: int) -> int | None:
    """Blocks per cache from --capacity-blocks or --capacity-frac (None: the profile's)."""
    from anchorage.cli import CLIError

    if args.capacity_blocks is not None:
        capacity = args.capacity_blocks
    elif args.capacity_frac is None:
        return None  # timed mode: the profile's
    else:
        if not 0 < args.capacity_frac:
            raise CLIError("--capacity-frac must be > 0")
        capacity = max(1, round(unique * args.capacity_frac))
    if capacity <= 0:
        raise CLIError("--capacity-blocks must be positive")
    return capacity


def format_table(results: list[dict]) -> str:
    head = f"{'policy':<18}{'hit rate':>10}{'token hit':>11}{'hit blocks':>12}" \
           f"{'evictions':>11}{'us/req':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['policy']:<18}{r['hit_rate']:>10.2%}{r['token_hit_rate']:>11.2%}"
                     f"{r['hit_blocks']:>12}{r['evictions']:>11}{r['us_per_request']:>9.1f}")
    return "\n".join(lines)


def run_timed_mode(args, records, contexts, bs, capacity, names, params, unique,
                   skipped) -> int:
    from anchorage.sim.replay import infinite_hit_rate

    routers, router_params, tiering, profile, cfg = _timed_setup(args, contexts, records, bs,
                                                                 capacity, names)
    results = []
    for router in routers:
        results += _timed_runs(records, contexts, cfg, router, names, params, router_params,
                               tiering, args.replicas)
    out = {
        "trace": args.trace, "mode": "timed", "profile": profile.name,
        "profile_source": profile.source,
        "calibration": args.calibration or (args.profile if profile.measured else None),
        "arrivals": args.arrivals,
        "admission": args.admission,
        "admission_ttft_target_s": (_admission_params(args) or {}).get("ttft_target_s"),
        "tiering": args.tiering,
        "replicas": args.replicas, "router": args.router, "block_size": bs,
        "capacity_blocks": cfg.capacity, "requests": len(records), "unique_blocks": unique,
        "infinite_hit_rate": infinite_hit_rate(contexts, bs), "skipped_lines": skipped,
        "results": results,
    }
    if args.json:
        sys.stdout.write(json.dumps(_clean(out)))
        sys.stdout.write("\n")
        return 0
    print(f"trace {args.trace}: {len(records)} requests, block size {bs}, profile "
          f"{profile.name} ({profile.source.partition(':')[0] or 'derived'}), "
          f"{args.replicas} replicas x {cfg.capacity} blocks, {args.arrivals}-loop arrivals")
    print(format_timed_table(results))
    for r in results:
        if "bytes_moved" in r:
            print(f"{r['router']}/{r['policy']} tiering {args.tiering}: host hit rate "
                  f"{r['host_hit_rate']:.2%}, {r['offloads']} offloads, {r['reloads']} reloads "
                  f"{r['outcomes']}, {r['bytes_moved'] / 1e9:.1f} GB moved")
    return 0


def _timed_setup(args, contexts, records, bs, capacity, names):
    """The routers, router parameters, tiering, profile and ``TimedConfig`` the flags ask
    for (a clear error for each bad combination)."""
    from anchorage.cli import CLIError
    from anchorage.sim.cluster import POOLED, TimedConfig

    routers = [r.strip() for r in args.router.split(",") if r.strip()]
    known = router_choices()
    bad = [r for r in routers if r not in known]
    if bad or not routers:
        raise CLIError(f"unknown router {', '.join(bad) or '(none)'}; known: {', '.join(known)}")
    router_params = parse_params(args.router_param, scoped=False)
    base_profile = resolve_profile(args)
    tiering = tiering_config(args, base_profile)
    if tiering is not None and POOLED in routers:
        raise CLIError("--tiering needs one pool per replica: not with --router pooled")
    if args.agent_hints:
        for c, r in zip(contexts, records):
            c.agent_hint = r.agent
    try:
        profile = base_profile.with_(block_size=bs)
        cfg = TimedConfig(profile, replicas=args.replicas, mode=args.arrivals,
                          time_scale=args.time_scale, think_s=args.think_s,
                          warmup_s=args.warmup_s, capacity_blocks=capacity,
                          max_sessions=args.max_sessions, admission=args.admission,
                          admission_params=_admission_params(args))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.arrivals == "closed":
        from anchorage.policies.registry import is_offline
        for name in names:
            if is_offline(name):
                print(f"note: {name} reads next uses from the trace's request order and clock; "
                      "closed-loop arrivals reorder requests, so here it is a reference, not "
                      "an oracle (bench/timed_explore.py replayed-belady gives a closed-loop "
                      "estimate)", file=sys.stderr)
    return routers, router_params, tiering, profile, cfg


def _timed_runs(records, contexts, cfg, router, names, params, router_params, tiering,
                replicas) -> list[dict]:
    """One timed run per policy behind ``router``; Belady's gap where it is a reference."""
    import time

    from anchorage.cli import CLIError
    from anchorage.sim.cluster import POOLED, run_timed

    results = []
    for name in names:
        t0 = time.perf_counter()
        try:
            if tiering is not None:
                from anchorage.tiering.sim import run_tiered
                res = run_tiered(records, contexts, cfg, name, router, tiering=tiering,
                                 policy_params=params.get(name),
                                 router_params=router_params)
            else:
                res = run_timed(records, contexts, cfg, name, router,
                                policy_params=params.get(name),
                                router_params=None if router == POOLED else router_params)
        except (TypeError, ValueError) as exc:
            raise CLIError(f"{router}/{name}: {exc}") from None
        elapsed = time.perf_counter() - t0
        res["us_per_request"] = elapsed / max(1, len(records)) * 1e6
        res["oversize"] = res["rejected"]
        results.append(res)
    bel = [r for r in results if r["policy"] == "belady"]
    # Belady ranks by the trace's next use: a reference only where one cache sees
    # every request (one replica, or pooled); across replicas it is not an optimum
    if bel and (router == POOLED or replicas == 1):
        for r in results:
            r["belady_gap"] = bel[0]["hit_rate"] - r["hit_rate"]
    return results


def resolve_profile(args):
    """The profile ``--profile`` / ``--calibration`` name; CLIError if bad."""
    from anchorage.cli import CLIError
    from anchorage.sim.profiles import HardwareProfile, get_profile

    try:
        if args.calibration:
            prof = HardwareProfile.from_calibration(args.calibration)
            if args.profile and args.profile != prof.name:
                raise CLIError(f"--calibration {args.calibration} measured {prof.name}, "
                               f"not --profile {args.profile}")
            return prof
        return get_profile(args.profile or "h200-llama3-8b")
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def tiering_config(args, profile=None):
    """The ``--tiering`` options as a ``TieringConfig`` (None when off); CLIError if bad.
    The host link is ``--host-bw-gbs`` each way if given, else ``profile``'s measured one
    (``HostTierConfig.for_profile``), else the host tier's default."""
    from anchorage.cli import CLIError

    if getattr(args, "tiering", "off") == "off":
        return None
    if args.mode != "timed":
        raise CLIError("--tiering needs --mode timed")
    from anchorage.tiering.host_tier import GB, HostTierConfig
    from anchorage.tiering.sim import TieringConfig
    from anchorage.tiering.temporal import GateParams
    try:
        bw = None if args.host_bw_gbs is None else args.host_bw_gbs * GB
        fields = {"capacity_bytes": args.host_tier_gb * GB, "d2h_bytes_s": bw,
                  "h2d_bytes_s": bw}
        host = (HostTierConfig.for_profile(profile, **fields) if profile is not None else
                HostTierConfig(**{k: v for k, v in fields.items() if v is not None}))
        gate = (GateParams() if args.offload_watermark is None
                else GateParams(watermark=args.offload_watermark))
        return TieringConfig(mode=args.tiering, host=host, gate=gate)
    except ValueError as exc:
        raise CLIError(f"bad tiering option: {exc}") from None


def router_choices() -> list[str]:
    from anchorage.routing.registry import router_names

    return router_names() + ["pooled"]


def _clean(x):
    """JSON has no NaN: metrics without samples become null."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def format_timed_table(results: list[dict]) -> str:
    head = (f"{'router':<14}{'policy':<14}{'hit rate':>9}{'TTFT mean':>11}{'p50':>8}"
            f"{'p90':>8}{'p99':>8}{'turns/s':>9}{'recomputed':>12}{'evict':>9}{'preempt':>8}")
    lines = [head, "-" * len(head)]

    def f(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) and v == v else "-"
    for r in results:
        lines.append(
            f"{r['router']:<14}{r['policy']:<14}{r['hit_rate']:>9.2%}"
            f"{f(r['ttft_mean_s'], '>10.3f')}s{f(r['ttft_p50_s'], '>7.3f')}s"
            f"{f(r['ttft_p90_s'], '>7.3f')}s{f(r['ttft_p99_s'], '>7.3f')}s"
            f"{f(r['throughput_rps'], '>9.2f')}{r['recomputed_tokens']:>12}"
            f"{r['evictions']:>9}{r['preemptions']:>8}")
    return "\n".join(lines)


def _admission_params(args) -> dict | None:
    """The timed simulator's prefix-aware admission parameters from the flags."""
    from anchorage.cli import CLIError

    if args.admission != "prefix-aware" or not args.admission_ttft_target:
        return None
    if args.admission_ttft_target < 0:
        raise CLIError(f"--admission-ttft-target must be >= 0, got {args.admission_ttft_target}")
    return {"ttft_target_s": args.admission_ttft_target}
