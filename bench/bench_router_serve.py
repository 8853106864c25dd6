"""Router overhead through Ray Serve: sequential ``/v1/completions`` latency (p50/p99)
sent directly to an upstream vs through the router, per routing policy.

Real local Ray, inside a private network namespace this script creates (``unshare -n``, as
root); the upstreams are the tests' small OpenAI-compatible server
(``tests.router.fake_upstream``). The ``serve/noop`` row is Ray Serve's own floor (an
ingress that answers at once), so router cost = router row - noop row. Results go under
``serve_overhead`` in ``bench/results/router.json`` (beside ``bench_router``'s decision
latency).

    .venv/bin/python -m bench.bench_router_serve [--policies round_robin,agent]
        [--requests 300] [--out bench/results/router.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from bench import harness
from bench.bench_router import pct


def serve_overhead(args) -> int:
    """Runs inside the private network namespace (see ``main``)."""
    import asyncio
    import threading

    import httpx
    import ray
    from anchorage.router.app import build_app
    from anchorage.router.config import RouterConfig
    from ray import serve

    from tests.router.fake_upstream import FakeUpstream

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    ups = [FakeUpstream(f"u{i}") for i in range(2)]
    urls = [f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(u.start(), loop).result()}"
            for u in ups]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             namespace="anchorage-bench", logging_level="WARNING", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    rng = random.Random(0)
    bodies = [{"model": "tiny", "max_tokens": 1,
               "prompt": [rng.randrange(1000) for _ in range(16 * rng.randint(4, 64))]}
              for _ in range(args.requests)]

    def measure(base: str, session: bool) -> list[float]:
        out = []
        with httpx.Client(timeout=30) as c:
            for i, b in enumerate(bodies):
                h = {"x-session-id": f"s{i % 50}"} if session else {}
                t0 = time.perf_counter()
                r = c.post(base + "/v1/completions", json=b, headers=h)
                out.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
        return out[20:]                                   # warm connections first

    rows = []
    direct = measure(urls[0], False)
    rows.append({"path": "direct", "p50_ms": statistics.median(direct), "p99_ms": pct(direct, 0.99)})

    # Ray Serve's own floor: an ingress that answers without routing or proxying.
    from fastapi import FastAPI
    noop_api = FastAPI()

    @serve.deployment(name="noop")
    @serve.ingress(noop_api)
    class Noop:
        @noop_api.post("/v1/completions")
        async def completions(self) -> dict:
            return {"choices": [{"text": ""}]}
    serve.run(Noop.bind(), name="anchorage-router", route_prefix="/")
    lat = measure("http://127.0.0.1:8000", False)
    rows.append({"path": "serve/noop", "p50_ms": statistics.median(lat), "p99_ms": pct(lat, 0.99)})
    for i, policy in enumerate(args.policies.split(",")):
        cfg = RouterConfig(replicas=urls, policy=policy, actor_name=f"bench-state-{i}").validate()
        serve.run(build_app(cfg), name="anchorage-router", route_prefix="/")
        lat = measure("http://127.0.0.1:8000", True)
        rows.append({"path": f"router/{policy}", "p50_ms": statistics.median(lat),
                     "p99_ms": pct(lat, 0.99)})
        ray.kill(ray.get_actor(cfg.actor_name))
    serve.shutdown()
    ray.shutdown()
    base = rows[0]["p50_ms"]
    print(f"{'path':<24}{'p50 ms':>10}{'p99 ms':>10}{'overhead p50 ms':>18}  "
          f"({args.requests - 20} sequential requests; load average {os.getloadavg()[0]:.1f})")
    for r in rows:
        r["overhead_p50_ms"] = r["p50_ms"] - base
        print(f"{r['path']:<24}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['overhead_p50_ms']:>18.2f}")
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data["serve_overhead"] = {"requests": args.requests - 20, "load_average": os.getloadavg()[0],
                              "rows": rows, "meta": harness.meta()}
    harness.write_json(out, data, with_meta=False)
    return 0



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="round_robin,agent")
    ap.add_argument("--requests", type=int, default=300, help="requests per path")
    ap.add_argument("--out", default="bench/results/router.json")
    args = ap.parse_args(argv)
    if harness.in_netns():
        return serve_overhead(args)
    return harness.reexec_in_netns(
        "bench.bench_router_serve", argv if argv is not None else sys.argv[1:],
        missing="bench_router_serve needs root and unshare (it runs Ray in a private network "
                "namespace)")


if __name__ == "__main__":
    sys.exit(main())
