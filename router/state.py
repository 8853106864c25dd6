"""The routing state shared by every router replica: one object, hosted in one named Ray
actor (``app.RoutingStateActor``), so all replicas see the same sessions, prefix model and
in-flight counts (per-process state would herd each replica onto its own "best" backend).

It owns: the upstream table (stable id, URL, health, in-flight, scraped queue and KV
usage, estimated queued prefill tokens), the routing policy (``anchorage.routing``), admission (429 when every healthy
replica is at ``max_inflight_per_replica``), passive and active health (ejection after
``eject_after_failures`` consecutive failures, readmission on a good probe) and the
metrics. It is plain Python: unit-testable without Ray; the actor only wraps it.

Load signal handed to the policy (``ReplicaView``), per replica:

- ``waiting`` = ``vllm:num_requests_waiting`` and ``running`` = ``max(in-flight from this
  router, vllm:num_requests_running + waiting) - waiting`` (the scrape, every
  ``health_interval_s``, sees every client's requests; the in-flight count is fresh);
- ``kv_usage`` = ``vllm:kv_cache_usage_perc``;
- ``queued_tokens``: vLLM exports no token-denominated queue gauge (0.32), so the router
  estimates it from what it sent: each request adds ``input_length - predicted cached
  tokens`` (the policy's ``predicted_hit_blocks`` x tokens per key) when it is sent, and
  removes it at its first response byte (``first_byte``: a streamed response's first
  chunk comes with the first token, i.e. when the prefill is done) or when it ends.
  Requests other clients send a replica are in ``waiting``, not in this estimate.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit
from typing import Any, Iterable

from anchorage.policies.base import RequestContext
from anchorage.routing import NoReplicaError, ReplicaView, make_router
from anchorage.routing.vllm_events import VLLMEventTranslator
from anchorage.router.config import RouterConfig
from anchorage.router.metrics import RouterMetrics

log = logging.getLogger("anchorage.router")

_GAUGES = {"vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
           "vllm:kv_cache_usage_perc": "kv_usage"}
_LINE = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})?\s+([0-9.eE+-]+)$")


@dataclass
class Upstream:
    id: int
    url: str
    name: str = ""             # the ``replica`` label: its pod's name when discovered, else the URL
    healthy: bool = True
    inflight: int = 0
    waiting: int = 0           # scraped
    running: int = 0           # scraped
    kv_usage: float = 0.0      # scraped
    queued_tokens: int = 0     # estimated: prompts sent, no first byte yet
    failures: int = 0          # consecutive


def parse_vllm_gauges(text: str) -> dict[str, float]:
    """Sum of each known vLLM gauge over its label sets (one engine per replica)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) in _GAUGES:
            k = _GAUGES[m.group(1)]
            out[k] = out.get(k, 0.0) + float(m.group(2))
    return out


class RoutingState:
    def __init__(self, config: dict[str, Any] | RouterConfig) -> None:
        self.cfg = config if isinstance(config, RouterConfig) else RouterConfig(**config)
        self.router = make_router(self.cfg.policy, **self.cfg.policy_params)
        self.metrics = RouterMetrics()
        self.upstreams: dict[int, Upstream] = {}
        self._next_id = 0
        self._health_task: asyncio.Task | None = None
        self.translator = VLLMEventTranslator()
        self._kv_inbox: collections.deque = collections.deque()   # (url, events), any thread
        self.kv_events_applied = 0
        self._prefill: dict[tuple[int, int], int] = {}   # (replica, request id) -> tokens
        self.set_replicas(self.cfg.replicas)

    # -- membership -----------------------------------------------------------------
    def set_replicas(self, urls: Iterable[str], names: dict[str, str] | None = None) -> None:
        """The replicas are now ``urls``; ``names`` (URL -> pod name, from discovery) label
        their series. A removed replica's series are deleted."""
        names = names or {}
        want = list(dict.fromkeys(u.rstrip("/") for u in urls))
        have = {u.url: u for u in self.upstreams.values()}
        for url in want:
            if url not in have:
                up = Upstream(self._next_id, url, names.get(url) or url)
                self.upstreams[up.id] = up
                self._next_id += 1
                self.metrics.healthy.labels(up.name).set(1)
                log.info("replica added: %s (%s)", up.name, url)
        for url, up in have.items():
            if url not in want:
                del self.upstreams[up.id]
                self.router.on_replica_removed(up.id)
                self.translator.forget(up.id)
                self.metrics.forget_replica(up.name)
                log.info("replica removed: %s (%s)", up.name, url)

    def kv_endpoints(self) -> dict[str, str]:
        """Replica URL -> ZMQ endpoint of its KV event publisher (config)."""
        out = {}
        for u in self.upstreams.values():
            ep = self.cfg.kv_events.get(u.url)
            if ep is None and self.cfg.kv_events_port:
                ep = f"tcp://{urlsplit(u.url).hostname}:{self.cfg.kv_events_port}"
            if ep:
                out[u.url] = ep
        return out

    def queue_kv_events(self, url: str, events: list[dict]) -> None:
        """Thread-safe: called by the subscriber thread."""
        self._kv_inbox.append((url, events))

    def apply_kv_events(self) -> None:
        """Feed queued vLLM events to the policy (on the state's own thread)."""
        by_url = {u.url: u.id for u in self.upstreams.values()}
        while self._kv_inbox:
            url, events = self._kv_inbox.popleft()
            rid = by_url.get(url)
            if rid is None:
                continue
            for raw in events:
                for ev in self.translator.translate(rid, raw):
                    self.router.on_kv_event(rid, ev)
                    self.kv_events_applied += 1

    def _views(self, ups: list[Upstream]) -> list[ReplicaView]:
        cap = self.cfg.max_inflight_per_replica
        return [ReplicaView(index=u.id, name=u.url, healthy=u.inflight < cap,
                            running=max(u.inflight, u.running + u.waiting) - u.waiting,
                            waiting=u.waiting, kv_usage=u.kv_usage,
                            queued_tokens=u.queued_tokens)
                for u in ups]

    # -- decisions ------------------------------------------------------------------
    def pick(self, ctx: RequestContext, exclude: Iterable[int] = (),
             tokens_per_key: float = 1.0) -> dict[str, Any]:
        self.apply_kv_events()
        ex = set(exclude)
        ups = [u for u in self.upstreams.values() if u.healthy and u.id not in ex]
        if not ups:
            return {"status": "unavailable"}
        if all(u.inflight >= self.cfg.max_inflight_per_replica for u in ups):
            return {"status": "saturated", "retry_after_s": self.cfg.retry_after_s}
        views = self._views(ups)
        t0 = time.perf_counter()
        try:
            p = self.router.pick(ctx, views)
        except NoReplicaError:
            return {"status": "unavailable"}
        self.metrics.decision.observe(time.perf_counter() - t0)
        up = ups[p]
        predicted = int(self.router.predicted_hit_blocks(ctx, up.id) * tokens_per_key)
        self.router.on_start(ctx, up.id)
        prefill = max(0, int(ctx.input_length) - predicted)
        self._prefill[(up.id, ctx.request_id)] = prefill
        up.queued_tokens += prefill
        self.metrics.queued_tokens.labels(up.name).set(up.queued_tokens)
        up.inflight += 1
        self.metrics.inflight.labels(up.name).set(up.inflight)
        return {"status": "ok", "replica": up.id, "url": up.url, "predicted_tokens": predicted}

    def first_byte(self, ctx: RequestContext, replica: int) -> None:
        """The replica started answering ``ctx`` (its prefill is done): its prompt leaves
        the replica's queued tokens."""
        tokens = self._prefill.pop((replica, ctx.request_id), None)
        up = self.upstreams.get(replica)
        if tokens is not None and up is not None:
            up.queued_tokens = max(0, up.queued_tokens - tokens)
            self.metrics.queued_tokens.labels(up.name).set(up.queued_tokens)

    def finish(self, ctx: RequestContext, replica: int, outcome: str,
               usage: dict[str, Any] | None = None, predicted_tokens: int = 0) -> None:
        """A request attempt ended. ``outcome``: ok, client_error, upstream_error,
        connect_error, retried, cancelled (the client left)."""
        self.first_byte(ctx, replica)
        up = self.upstreams.get(replica)
        url = up.name if up else "removed"   # (its series were deleted with it)
        if up is not None:
            up.inflight = max(0, up.inflight - 1)
            self.metrics.inflight.labels(url).set(up.inflight)
            self.router.on_finish(ctx, replica)
            if outcome in ("ok", "client_error"):
                up.failures = 0
            elif outcome in ("upstream_error", "connect_error", "retried"):
                self._failure(up)
        self.metrics.requests.labels(url, self.cfg.policy, outcome).inc()
        if outcome == "retried":
            self.metrics.retries.labels(url, "connect_or_5xx").inc()
        if outcome == "ok":
            self.metrics.predicted.labels(url).inc(predicted_tokens)
            if usage:
                details = usage.get("prompt_tokens_details") or {}
                self.metrics.observed.labels(url).inc(int(details.get("cached_tokens") or 0))
                self.metrics.prompt.labels(url).inc(int(usage.get("prompt_tokens") or 0))

    def rejected(self, reason: str) -> None:
        self.metrics.rejected.labels(reason).inc()

    def _failure(self, up: Upstream) -> None:
        up.failures += 1
        if up.healthy and up.failures >= self.cfg.eject_after_failures:
            up.healthy = False
            self.metrics.ejections.labels(up.name).inc()
            self.metrics.healthy.labels(up.name).set(0)
            log.warning("replica ejected after %d failures: %s", up.failures, up.url)

    def _success(self, up: Upstream) -> None:
        up.failures = 0
        if not up.healthy:
            up.healthy = True
            self.metrics.healthy.labels(up.name).set(1)
            log.info("replica readmitted: %s", up.url)

    # -- active health --------------------------------------------------------------
    async def probe_once(self, client) -> None:
        async def one(up: Upstream) -> None:
            try:
                r = await client.get(up.url + "/health", timeout=self.cfg.health_timeout_s)
                ok = r.status_code == 200
            except Exception:  # noqa: BLE001 - any transport error is a failed probe
                ok = False
            if not ok:
                self._failure(up)
                return
            self._success(up)
            try:
                m = await client.get(up.url + "/metrics", timeout=self.cfg.health_timeout_s)
                if m.status_code == 200:
                    g = parse_vllm_gauges(m.text)
                    up.waiting = int(g.get("waiting", 0))
                    up.running = int(g.get("running", 0))
                    up.kv_usage = float(g.get("kv_usage", 0.0))
            except Exception:  # noqa: BLE001 - metrics are optional
                pass
        await asyncio.gather(*(one(u) for u in list(self.upstreams.values())))

    async def start(self) -> None:
        if self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        import httpx
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    await self.probe_once(client)
                except Exception:  # noqa: BLE001 - keep probing whatever happens
                    log.exception("health probe round failed")
                await asyncio.sleep(self.cfg.health_interval_s)

    # -- introspection --------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        return [{"id": u.id, "url": u.url, "name": u.name, "healthy": u.healthy, "inflight": u.inflight,
                 "failures": u.failures, "waiting": u.waiting, "running": u.running,
                 "kv_usage": u.kv_usage, "queued_tokens": u.queued_tokens,
                 "kv_events_applied": self.kv_events_applied}
                for u in self.upstreams.values()]

    def metrics_text(self) -> bytes:
        return self.metrics.text()
