"""Foundation benchmark: LRU vs Belady vs the infinite cache on the real traces.

Capacities 2, 5, 10 and 20 % of each trace's unique blocks; replay speed in requests/s and
microseconds per block operation for both policies. Real traces are read from
data/traces (or $ANCHORAGE_TRACES); a missing one is reported and skipped.

    .venv/bin/python -m bench.bench_foundation [--workloads mooncake,chatdev,weka] [--out F]
"""

from __future__ import annotations

import argparse
import sys
import time

from anchorage import bench, workloads
from bench import harness

FRACS = (0.02, 0.05, 0.10, 0.20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mooncake,mooncake-synthetic,chatdev,weka")
    ap.add_argument("--out", default="bench/results/foundation.json")
    args = ap.parse_args()
    rows, speed, missing = [], [], []
    for spec in args.workloads.split(","):
        try:
            t0 = time.perf_counter()
            wl = workloads.load(spec)
            load_s = time.perf_counter() - t0
        except (workloads.WorkloadUnavailable, ImportError) as exc:
            print(f"[skip] {spec}: {exc}", file=sys.stderr)
            missing.append(spec)
            continue
        block_ops = sum(len(c.keys) for c in wl.contexts)
        print(f"{spec}: {len(wl.contexts)} requests, {block_ops} block accesses, "
              f"{wl.unique_blocks} unique blocks, loaded in {load_s:.1f}s", file=sys.stderr)
        for r in bench.run_suite([wl], ["lru", "belady"], FRACS, half_lru=False,
                                 log=lambda s: print(s, file=sys.stderr)):
            rows.append(r)
            for p in ("lru", "belady"):
                us = r.results[p]["us_per_request"]
                speed.append({"workload": spec, "capacity": r.capacity_label, "policy": p,
                              "requests_per_s": 1e6 / us if us else 0.0,
                              "us_per_block_op": us * len(wl.contexts) / block_ops})
    print(bench.format_rows(rows, ["lru", "belady"], markdown=True))
    print()
    summary = []
    for spec in dict.fromkeys(s["workload"] for s in speed):
        for p in ("lru", "belady"):
            xs = sorted(s["requests_per_s"] for s in speed if s["workload"] == spec and s["policy"] == p)
            us = sorted(s["us_per_block_op"] for s in speed if s["workload"] == spec and s["policy"] == p)
            med, umed = xs[len(xs) // 2], us[len(us) // 2]
            summary.append({"workload": spec, "policy": p, "requests_per_s": med, "us_per_block_op": umed})
    print(harness.table([harness.Column("workload", "workload"), harness.Column("policy", "policy"),
                         harness.Column("requests/s (median over capacities)", "requests_per_s", ",.0f"),
                         harness.Column("us per block access", "us_per_block_op", ".3f")],
                        summary, markdown=True))
    harness.write_json(args.out, {
        "machine": bench.machine_description(), "capacities": FRACS, "missing": missing,
        "rows": [r.to_json() for r in rows], "speed": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
