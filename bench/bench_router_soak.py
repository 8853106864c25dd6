"""The router soak as a benchmark (issue 21, "Done when"): several router replicas in front
of dozens of fake engines on loopback, one engine killed and restarted on a schedule, a
steady client load for ``--seconds``; figures to ``bench/results/router_soak.json``.

    .venv/bin/python bench/bench_router_soak.py [--seconds 300] [--upstreams 32]
        [--replicas 2] [--concurrency 16] [--kill-every 6] [--down 3]

As root, inside a private network namespace this script creates (Ray and Serve run
there, as in the tests). The run is ``tests.router.soak.run`` (the CI test runs the same
for a minute): lost non-streaming requests (target 0), streaming requests that ended with
the SSE error event, in-flight counts once the load stops (target 0), the router
replicas' resident memory after warm-up and at the end (target: flat), and which
upstreams were ejected (target: only killed ones).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def inner(args) -> int:
    from bench import harness
    from tests.router import ops

    load = os.getloadavg()[0]
    ops.start_ray()
    try:
        r = ops.soak(args.upstreams, args.seconds, args.replicas, concurrency=args.concurrency,
                     kill_every_s=args.kill_every, down_s=args.down)
    finally:
        ops.shutdown()
    r.update(load_average_start=load, load_average_end=os.getloadavg()[0],
             cpus=os.cpu_count(), benchmark="router_soak",
             ok={"no_lost_request": r["lost"] == 0, "inflight_back_to_zero": r["inflight_after"] == 0,
                 "ejected_only_killed": set(r["ejected"]) <= set(r["killed"]),
                 "memory_flat": r["rss_growth_mib"] < 30 + 0.1 * (r["rss_after_warmup_mib"] or 0)})
    harness.write_json(args.out, r)
    print(json.dumps({k: v for k, v in r.items() if k != "rss_mib"}, indent=1))
    return 0 if all(r["ok"].values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--upstreams", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=2, help="router replicas")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--kill-every", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--down", type=float, default=3.0, help="seconds a killed engine stays down")
    ap.add_argument("--out", default=str(ROOT / "bench/results/router_soak.json"))
    args = ap.parse_args()
    from bench import harness
    if harness.in_netns():
        return inner(args)
    return harness.reexec_in_netns(__spec__.name, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
