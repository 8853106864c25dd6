"""Block-pool replay speed: requests/s and microseconds per block operation, lru and belady.

Workloads: the Mooncake conversation trace (data/traces or $ANCHORAGE_TRACES; said
clearly and skipped when absent) and a generated multi-agent trace. Capacities: 5 % and
20 % of each trace's unique blocks. A "block operation" is one block a request holds
(touched on a hit or newly allocated, later freed): every block moves through allocate /
touch, cache and free once. Times are process CPU time (``time.process_time``: on a
machine shared with other work, wall time measures the neighbours), best of ``--repeat``
runs, with the wall time beside it; ``build_ms`` is the policy's construction (Belady's
next-use table).

    .venv/bin/python -m bench.bench_pool [--workloads mooncake,generated:pipeline]
                                          [--repeat 3] [--out bench/results/pool.json]
    .venv/bin/python -m bench.bench_pool --profile mooncake [--profile-policy belady]

The same allocation path through vLLM's real ``KVCacheManager``, stock and patched by the
plugin, is ``bench.bench_vllm_patch``.
"""

from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import sys
import time

from anchorage import workloads
from anchorage.policies.registry import make_policy
from anchorage.sim.replay import replay
from bench import harness

FRACS = (0.05, 0.20)
POLICIES = ("lru", "belady")


def block_ops(contexts, capacity: int, bs: int) -> int:
    """Blocks held by the requests that run, as the replay admits and grows them."""
    n = 0
    for c in contexts:
        if -(-c.input_length // bs) > capacity:
            continue
        total = min(c.input_length + max(c.output_length - 1, 0), capacity * bs)
        n += -(-total // bs)
    return n


def measure(wl, capacity: int, policy: str, repeat: int) -> dict:
    best = None
    for _ in range(repeat):
        t0 = time.process_time()
        pol = make_policy(policy, block_size=wl.block_size, contexts=wl.contexts)
        t1, w1 = time.process_time(), time.perf_counter()
        res = replay(wl.contexts, capacity, wl.block_size, pol)
        t2, w2 = time.process_time(), time.perf_counter()
        if best is None or t2 - t1 < best[1]:
            best = (t1 - t0, t2 - t1, w2 - w1, res)
    build_s, run_s, wall_s, res = best
    ops = block_ops(wl.contexts, capacity, wl.block_size)
    n = len(wl.contexts)
    return {"workload": wl.name, "policy": policy, "capacity_blocks": capacity,
            "capacity_frac": round(capacity / max(wl.unique_blocks, 1), 4),
            "requests": n, "block_ops": ops, "hit_rate": res.hit_rate,
            "evictions": res.evictions, "replay_cpu_s": run_s, "replay_wall_s": wall_s,
            "build_ms": build_s * 1e3,
            "requests_per_s": n / run_s, "us_per_request": run_s / n * 1e6,
            "us_per_block_op": run_s / max(ops, 1) * 1e6}


def profile(spec: str, policy: str) -> None:
    wl = workloads.load(spec)
    cap = max(1, int(wl.unique_blocks * 0.05))
    pol = make_policy(policy, block_size=wl.block_size, contexts=wl.contexts)
    prof = cProfile.Profile()
    prof.enable()
    replay(wl.contexts, cap, wl.block_size, pol)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mooncake,generated:pipeline")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/pool.json")
    ap.add_argument("--profile", metavar="WORKLOAD", help="profile one replay and exit")
    ap.add_argument("--profile-policy", default="lru", help="policy to profile (default lru)")
    args = ap.parse_args()
    if args.profile:
        profile(args.profile, args.profile_policy)
        return 0
    make_policy("lru")  # the registry discovers policy modules once: not part of a timing
    rows, missing = [], []
    for spec in args.workloads.split(","):
        try:
            wl = workloads.load(spec)
        except workloads.WorkloadUnavailable as exc:
            print(f"[skip] {spec}: {exc}", file=sys.stderr)
            missing.append({"workload": spec, "reason": str(exc)})
            continue
        for frac in FRACS:
            cap = max(1, int(wl.unique_blocks * frac))
            for pol in POLICIES:
                rows.append(measure(wl, cap, pol, args.repeat))
    C = harness.Column
    print(harness.table([C("workload", "workload", width=22, align="<"),
                         C("policy", "policy", width=8, align="<"),
                         C("cap", "capacity_blocks", width=7), C("requests", "requests", width=9),
                         C("block ops", "block_ops", width=11),
                         C("hit rate", "hit_rate", ".2%", width=9),
                         C("req/s", "requests_per_s", ".0f", width=10),
                         C("us/req", "us_per_request", ".1f", width=8),
                         C("us/blk op", "us_per_block_op", ".3f", width=10),
                         C("build ms", "build_ms", ".1f", width=9)], rows, sep="", rule=True))
    out = {"benchmark": "pool", "python": platform.python_version(),
           "machine": platform.machine(), "repeat": args.repeat, "rows": rows,
           "skipped": missing}
    path = harness.write_json(args.out, out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
