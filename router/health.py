"""Active health of the upstreams, per router process: every ``health_interval_s`` each
replica's ``GET /health`` (a failure counts like a transport failure; a success readmits
an ejected replica, and ``RoutingState`` then forgets its model of that replica's
cache), its vLLM gauges from ``/metrics`` (queue and KV usage for the load signal, whether it
keeps a host-memory KV tier, its prefill rate from the prompt-token and prefill-time
counters) and,
until known and then every ``MODELS_EVERY`` rounds, the models it serves from
``/v1/models`` (model-aware routing)."""

from __future__ import annotations

import asyncio
import logging

from anchorage.router.state import (RoutingState, Upstream, has_host_tier, parse_vllm_gauges,
                                    prefill_counters)

log = logging.getLogger("anchorage.router")
MODELS_EVERY = 15


async def probe_once(state: RoutingState, client, round_no: int = 0,
                     headers: dict | None = None) -> None:
    cfg = state.cfg

    async def one(up: Upstream) -> None:
        try:
            r = await client.get(up.url + "/health", timeout=cfg.health_timeout_s)
            ok = r.status_code == 200
        except Exception:  # noqa: BLE001 - any transport error is a failed probe
            ok = False
        if not ok:
            state._failure(up)
            return
        state._success(up)
        try:
            m = await client.get(up.url + "/metrics", timeout=cfg.health_timeout_s)
            if m.status_code == 200:
                g = parse_vllm_gauges(m.text)
                up.waiting = int(g.get("waiting", 0))
                up.running = int(g.get("running", 0))
                up.kv_usage = float(g.get("kv_usage", 0.0))
                up.host_tier = has_host_tier(m.text)
                counters = prefill_counters(m.text)
                if counters is not None:
                    up.prefill.update(*counters)
        except Exception:  # noqa: BLE001 - metrics are optional
            pass
        if not up.models or round_no % MODELS_EVERY == 0:
            try:
                r = await client.get(up.url + "/v1/models", timeout=cfg.health_timeout_s * 5,
                                     headers=headers or {})
                if r.status_code == 200:
                    state.set_models(up, r.json().get("data") or [])
            except Exception:  # noqa: BLE001 - models stay as last seen
                pass
    await asyncio.gather(*(one(u) for u in list(state.upstreams.values())))


async def health_loop(state: RoutingState, headers: dict | None = None) -> None:
    import httpx
    round_no = 0
    async with httpx.AsyncClient() as client:
        while True:
            try:
                await probe_once(state, client, round_no, headers)
            except Exception:  # noqa: BLE001 - keep probing whatever happens
                log.exception("health probe round failed")
            round_no += 1
            await asyncio.sleep(state.cfg.health_interval_s)
