"""What the node pool's index costs the engine's scheduler thread
(``anchorage.node_agent.offload.node_pool.PoolIndex``): a node of ``--peers`` other engines,
each with ``--chunks`` host chunks all published (256 GiB of 2 MiB chunks by default: an H200
node's DRAM share per GPU at Llama-3-8B's 16-token blocks), in a tmpfs directory.

Measured: the refreshes that take in the peers when they join (how many, the slowest, the
total), a refresh when nothing changed, one after ``--changes`` chunks changed per peer,
and a lookup (``find``) at the default refresh interval; for the node-wide LRU (at most
every 50 ms, ``NodePoolManager.balance``): the scan of this engine's read stamps
(``--growth`` times ``--chunks`` slots) with ``--changes`` chunks read by a peer and with
none, and the node's capacity and usage over the peers (``node``).

    .venv/bin/python -m bench.bench_node_pool [--peers 7] [--chunks 131072] [--growth 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from anchorage.node_agent.offload.node_pool import PoolIndex


def run(peers: int, chunks: int, changes: int, growth: int = 4) -> dict:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="anchorage-pool-bench-", dir=base)
    try:
        others = [PoolIndex(d, f"p{j}", "fp", chunks) for j in range(peers)]
        for j, p in enumerate(others):
            for c in range(chunks):
                p.publish(c, b"k%d-%d" % (j, c))
        me = PoolIndex(d, "me", "fp", chunks * growth, share=chunks, refresh_s=0.0,
                       scan_s=1e9)
        worst, n, t0 = 0.0, 0, time.perf_counter()
        while True:
            t = time.perf_counter()
            me.refresh()
            worst = max(worst, time.perf_counter() - t)
            n += 1
            if all(v.seen_epoch == int(v.epoch[0]) for v in me.peers.values()):
                break
        join_s = time.perf_counter() - t0
        t = time.perf_counter()
        me.refresh()
        idle_ms = 1e3 * (time.perf_counter() - t)
        for j, p in enumerate(others):
            for c in range(changes):
                p.retract(c)
                p.publish(c, b"n%d-%d" % (j, c))
        t = time.perf_counter()
        me.refresh()
        changed_ms = 1e3 * (time.perf_counter() - t)
        me.refresh_s = 0.05
        k = 100_000
        t = time.perf_counter()
        for i in range(k):
            me.find(b"k%d-%d" % (i % peers, i % chunks))
        find_us = 1e6 * (time.perf_counter() - t) / k
        reader = others[0]
        reader.refresh(force=True)            # takes in "me"
        me.reads_since()
        for c in range(changes):
            reader.stamp_read("me", c)
        t = time.perf_counter()
        fresh = len(me.reads_since())
        reads_ms = 1e3 * (time.perf_counter() - t)
        t = time.perf_counter()
        me.reads_since()
        reads_idle_ms = 1e3 * (time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(1000):
            me.node()
        node_us = 1e3 * (time.perf_counter() - t)
        assert fresh == changes
        out = {"peers": peers, "chunks_per_peer": chunks, "table": len(me.table),
               "join_refreshes": n, "join_worst_ms": round(1e3 * worst, 2),
               "join_total_s": round(join_s, 3), "refresh_idle_ms": round(idle_ms, 4),
               "refresh_changed_ms": round(changed_ms, 3), "changes_per_peer": changes,
               "find_us": round(find_us, 3), "slots": chunks * growth,
               "reads_scan_ms": round(reads_ms, 3), "reads_scan_idle_ms": round(reads_idle_ms, 3),
               "node_us": round(node_us, 2)}
        for p in others + [me]:
            p.close()
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, default=7)
    ap.add_argument("--chunks", type=int, default=131072)
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--growth", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res = run(a.peers, a.chunks, a.changes, a.growth)
    print(json.dumps(res) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))


if __name__ == "__main__":
    main()
