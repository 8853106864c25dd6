"""The router soak (issue 21, "Done when"): the router (several Serve replicas) in front of
dozens of fake engines on loopback, engines killed and restarted on a schedule, a steady
client load for a bounded time. Runs inside a network namespace with Ray and Serve up
(``tests.router.ops``); the CI test runs it for a minute, ``bench/bench_router_soak.py``
longer and writes the figures.

Returns plain figures; the caller asserts:

- ``lost``: non-streaming requests that got no 200 (a killed engine loses none: a
  connection lost after sending is replayed, a connect error is retried elsewhere);
  streaming requests that broke are counted apart (``stream_errors``: they end with the
  SSE error event, as designed);
- ``inflight_after``: the in-flight counts of every router replica once the load stops;
- ``rss_mib``: each router replica's resident memory, sampled every ``sample_s`` (the
  growth after warm-up is ``rss_growth_mib``);
- ``ejected`` / ``killed``: every URL an ejection named, and every URL that was killed.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from typing import Any

import httpx


def router_pids() -> list[int]:
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                cmd = open(f"/proc/{e}/cmdline", "rb").read()
            except OSError:
                continue
            if b"ServeReplica:anchorage-router" in cmd:
                out.append(int(e))
    return out


def rss_mib(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def _client(router: str, stop: float, rng: random.Random, out: dict, stream_share: float,
                  sessions: int) -> None:
    async with httpx.AsyncClient(timeout=30) as c:
        while time.monotonic() < stop:
            s = rng.randrange(sessions)
            stream = rng.random() < stream_share
            body = {"model": "tiny", "prompt": [s % 7] * 64 + [rng.randrange(1000) for _ in range(32)],
                    "max_tokens": 3, "stream": stream}
            try:
                if stream:
                    async with c.stream("POST", router + "/v1/completions", json=body,
                                        headers={"x-session-id": f"s{s}"}) as r:
                        text = (await r.aread()).decode(errors="replace")
                    ok = r.status_code == 200 and "[DONE]" in text and '"error"' not in text
                    out["stream"] += 1
                    out["stream_errors"] += not ok
                else:
                    r = await c.post(router + "/v1/completions", json=body,
                                     headers={"x-session-id": f"s{s}"})
                    out["requests"] += 1
                    if r.status_code != 200:
                        out["lost"] += 1
                        out["lost_status"][str(r.status_code)] = \
                            out["lost_status"].get(str(r.status_code), 0) + 1
            except httpx.HTTPError as exc:
                out["requests" if not stream else "stream"] += 1
                out["lost" if not stream else "stream_errors"] += 1
                out["lost_status"][type(exc).__name__] = \
                    out["lost_status"].get(type(exc).__name__, 0) + 1


def run(upstreams: dict, run_coro, router: str, seconds: float, concurrency: int = 16,
        kill_every_s: float = 6.0, down_s: float = 3.0, warmup_s: float | None = None,
        sample_s: float = 2.0, stream_share: float = 0.2, sessions: int = 200,
        seed: int = 0) -> dict[str, Any]:
    """``upstreams``: name -> FakeUpstream (served on ``run_coro``'s loop)."""
    rng = random.Random(seed)
    warmup_s = seconds / 4 if warmup_s is None else warmup_s
    out: dict[str, Any] = {"requests": 0, "lost": 0, "stream": 0, "stream_errors": 0,
                           "lost_status": {}, "killed": [], "kills": 0}
    t0 = time.monotonic()
    stop = t0 + seconds
    names = sorted(upstreams)
    urls = {n: f"http://127.0.0.1:{upstreams[n].port}" for n in names}

    def chaos() -> None:
        nxt = t0 + kill_every_s
        while time.monotonic() < stop - down_s - 1:
            time.sleep(max(0.0, nxt - time.monotonic()))
            victim = rng.choice(names)
            run_coro(upstreams[victim].kill())
            out["kills"] += 1
            out["killed"].append(urls[victim])
            time.sleep(down_s)
            run_coro(upstreams[victim].start(upstreams[victim].port))
            nxt += kill_every_s
    samples: list[tuple[float, float]] = []

    def sampler() -> None:
        while time.monotonic() < stop:
            samples.append((time.monotonic() - t0, sum(rss_mib(p) for p in router_pids())))
            time.sleep(sample_s)

    async def load() -> None:
        await asyncio.gather(*(_client(router, stop, random.Random(seed * 1000 + i), out,
                                       stream_share, sessions) for i in range(concurrency)))
    threads = [threading.Thread(target=chaos, daemon=True),
               threading.Thread(target=sampler, daemon=True)]
    for t in threads:
        t.start()
    asyncio.run(load())
    for t in threads:
        t.join(down_s + 5)
    out["seconds"] = time.monotonic() - t0
    out["rps"] = (out["requests"] + out["stream"]) / out["seconds"]
    out["killed"] = sorted(set(out["killed"]))
    after = [m for t, m in samples if t >= warmup_s]
    out["rss_mib"] = [round(m, 1) for _, m in samples]
    out["rss_after_warmup_mib"] = after[0] if after else None
    out["rss_end_mib"] = after[-1] if after else None
    out["rss_growth_mib"] = (after[-1] - after[0]) if len(after) > 1 else 0.0
    return out
