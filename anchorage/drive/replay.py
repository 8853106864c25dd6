"""Send a plan (``anchorage.drive.plan``) as real HTTP traffic: one asyncio task per session
(requests in order, gaps honoured), at most ``concurrency`` requests in flight, streaming
completions (TTFT = time to the first SSE chunk; usage from the final chunk). Every
request's outcome is recorded; nothing is retried (the router retries upstream)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from anchorage.drive.plan import PlannedRequest, SessionPlan


@dataclass
class Result:
    index: int
    session: str
    agent: str | None
    ok: bool
    status: int
    error: str | None
    sent_s: float                 # since the replay started
    ttft_s: float | None
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict:
        return asdict(self)


async def _one(client, base: str, req: PlannedRequest, t0: float, timeout_s: float) -> Result:
    url = base + req.path
    sent = time.monotonic()
    status, err, ttft = 0, None, None
    usage: dict = {}
    try:
        async with client.stream("POST", url, json=req.body, headers=req.headers,
                                 timeout=timeout_s) as r:
            status = r.status_code
            if status != 200:
                body = (await r.aread()).decode(errors="replace")
                err = f"HTTP {status}: {body[:200]}"
            else:
                async for line in r.aiter_lines():
                    if ttft is None:
                        ttft = time.monotonic() - sent
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        continue
                    try:
                        obj = json.loads(data)
                    except ValueError:
                        err = f"bad SSE chunk: {data[:120]}"
                        continue
                    if "error" in obj:
                        err = f"stream error: {json.dumps(obj['error'])[:200]}"
                    if obj.get("usage"):
                        usage = obj["usage"]
                if err is None and not usage:
                    err = "stream ended without usage"
    except Exception as exc:  # noqa: BLE001 - every failure is a counted outcome
        err = f"{type(exc).__name__}: {exc}"[:200]
    details = usage.get("prompt_tokens_details") or {}
    return Result(req.index, req.session, req.agent, err is None and status == 200, status, err,
                  sent - t0, ttft, time.monotonic() - sent, int(usage.get("prompt_tokens") or 0),
                  int(details.get("cached_tokens") or 0), int(usage.get("completion_tokens") or 0))


async def replay(base_url: str, sessions: list[SessionPlan], concurrency: int = 8,
                 timeout_s: float = 300.0, on_result: Callable[[Result], None] | None = None,
                 max_sessions: int = 0) -> tuple[list[Result], float]:
    """Returns (results in completion order, wall seconds). ``max_sessions`` > 0: a closed
    system of that many session slots; sessions start in plan order, each at
    ``max(its start time, when a slot frees)`` (agent runs in flight, not arrivals)."""
    import httpx

    url = base_url.rstrip("/")
    sem = asyncio.Semaphore(max(1, concurrency))
    results: list[Result] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        t0 = time.monotonic()

        slots = asyncio.Semaphore(max_sessions) if max_sessions > 0 else None
        order = {id(sp): i for i, sp in enumerate(sessions)}
        turn = {"next": 0}
        cond = asyncio.Condition()

        async def session(sp: SessionPlan) -> None:
            await asyncio.sleep(max(0.0, sp.start_s - (time.monotonic() - t0)))
            if slots is None:
                await run_session(sp)
                return
            async with cond:   # take slots in plan order
                await cond.wait_for(lambda: turn["next"] == order[id(sp)])
            async with slots:
                async with cond:
                    turn["next"] += 1
                    cond.notify_all()
                await run_session(sp)

        async def run_session(sp: SessionPlan) -> None:
            for i, req in enumerate(sp.requests):
                if i:
                    await asyncio.sleep(req.delay_s)
                async with sem:
                    res = await _one(client, url, req, t0, timeout_s)
                results.append(res)
                if on_result:
                    on_result(res)

        await asyncio.gather(*(session(sp) for sp in sessions))
        return results, time.monotonic() - t0
