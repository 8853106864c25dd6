"""Oracle ladder: how much of the LRU-Belady gap each kind of ground truth closes.

At the half-LRU capacity of the multi-agent workloads (``bench.bench_policies``' workloads
and bisection), ``hybrid`` handed progressively more ground truth (``hybrid-oracle``,
``anchorage/policies/hybrid_oracle.py``: ``L1`` exact tool time, ``L2`` + which request is a
session's last, ``L3`` + the session's next agent, ``L4`` + each thread's exact next use,
``L5`` + each anchor's exact next use), and each piece alone; the share of the LRU-Belady
gap each closes says what each kind of knowledge is worth. Writes
``bench/results/policies_oracle_ladder.json``::

    BENCH_GEN_SESSIONS=40 .venv/bin/python -m bench.bench_oracle_ladder [--workloads ...]
        [--jobs N]
"""

from __future__ import annotations

import argparse
import sys

from anchorage.policies.registry import make_policy
from anchorage.sim.replay import replay
from bench import harness
from bench.bench_policies import half_lru_capacity, load

LADDER_WORKLOADS = ("gen-pipeline-1,gen-selector-1,gen-handoff-1,gen-debate-1,chatdev-0,"
                    "gen-hierarchical-1,gen-pipeline-2,gen-selector-2")
LADDER = ("L1", "L2", "L3", "L4", "L5", "tool", "end", "next", "thread", "anchor")


def oracle_ladder(name: str) -> dict:
    """Hit rates (and share of the LRU-Belady gap closed) of lru, hybrid, each
    ``hybrid-oracle`` level and knowledge alone, and belady, at the half-LRU capacity."""
    wl = load(name)
    ctxs, bs = wl.contexts, wl.block_size
    cap = half_lru_capacity(wl)
    rates = {}
    for p in ("lru", "hybrid", "belady"):
        rates[p] = replay(ctxs, cap, bs, make_policy(p, block_size=bs, contexts=ctxs)).hit_rate
    for k in LADDER:
        pol = make_policy("hybrid-oracle", block_size=bs, contexts=ctxs, know=k)
        rates[f"oracle:{k}"] = replay(ctxs, cap, bs, pol).hit_rate
    gap = rates["belady"] - rates["lru"]
    closed = {k: (v - rates["lru"]) / gap if gap > 0 else 1.0 for k, v in rates.items()}
    return {"workload": name, "blocks": cap, "hit_rate": rates, "gap_closed": closed}


def print_ladder(rows: list[dict]) -> None:
    cols = ["lru", "hybrid"] + [f"oracle:{k}" for k in LADDER] + ["belady"]
    table = []
    for r in rows:
        table.append({"workload": r["workload"], "blocks": r["blocks"],
                      **{c: f"{r['hit_rate'][c] * 100:.2f}" for c in cols}})
        table.append({"workload": "", "blocks": "gap closed",
                      **{c: f"{r['gap_closed'][c] * 100:.0f}%" for c in cols}})
    print(harness.table([harness.Column("workload", "workload", width=16),
                         harness.Column("blocks", "blocks", width=10)]
                        + [harness.Column(c.split(":")[-1], c, width=7) for c in cols],
                        table, sep=" "))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=LADDER_WORKLOADS)
    ap.add_argument("--out", default=str(harness.RESULTS / "policies_oracle_ladder.json"))
    harness.add_fanout_args(ap)
    a = ap.parse_args(argv)
    rows = harness.run_jobs(oracle_ladder, a.workloads.split(","), harness.Fanout.from_args(a))
    print_ladder(rows)
    harness.write_json(a.out, {"ladder": rows})
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
