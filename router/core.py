"""One router process: the request pipeline in named steps and the background work.

Per request (``handle``): ``limits`` (headers, body size and read time) -> ``parsing``
(JSON, metadata, tenant, trusted warm-ups, field caps) -> ``keys`` (block keys) ->
``state.pick`` (the policy, in-process) -> ``retries`` (send, classify failures) ->
``relay`` (answer or stream). Router-made errors are OpenAI error objects
(``errors``). Background (``start``): active health (``health``), the exchange with the
other router replicas (``sync``), the operator's document (``configdoc``), KV events
and Kubernetes discovery.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
import uuid
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from anchorage.policies.base import RequestContext
from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.metadata import to_vllm_body
from anchorage.router import health, limits, parsing, retries
from anchorage.router.config import RouterConfig
from anchorage.router.errors import RouterError, error_body, unavailable
from anchorage.router.keys import ChatTokenizer, request_keys
from anchorage.router.state import RoutingState

log = logging.getLogger("anchorage.router")


class RouterCore:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.state = RoutingState(cfg)
        self.tokenizer = ChatTokenizer(cfg.tokenizer) if cfg.tokenizer else None
        if self.tokenizer is not None and not cfg.vocab_size:
            cfg.vocab_size = self.tokenizer.vocab_size
        self._ids = itertools.count()
        self._auth = ({"authorization": f"Bearer {cfg.upstream_api_key}"}
                      if cfg.upstream_api_key else {})
        self.responses = BoundedLRU(100_000, 32 << 20)    # response id -> replica URL
        self.session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s,
                                             sock_read=cfg.read_timeout_s)
        self.sync = None
        self.config_watch = None
        self._tasks: list[asyncio.Task] = []
        self._pending_urls: list[str] | None = None
        self._kv = None

    # -- background --------------------------------------------------------------------
    async def start(self, peer_log=None) -> None:
        cfg = self.cfg
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=cfg.max_connections, limit_per_host=cfg.max_connections, ttl_dns_cache=300))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(health.health_loop(self.state, self._auth)))
        if peer_log is not None:
            from anchorage.router.sync import PeerSync
            self.sync = PeerSync(self.state, peer_log, uuid.uuid4().hex[:12], cfg.sync_interval_s)
            self._tasks.append(loop.create_task(self.sync.run()))
        if cfg.config_file or cfg.config_dir:
            from anchorage.router.configdoc import ConfigWatch
            self.config_watch = ConfigWatch(self.state, cfg.config_file, cfg.config_dir)
            self._tasks.append(loop.create_task(self.config_watch.run(cfg.config_poll_s)))
        if cfg.kv_events or cfg.kv_events_port:
            from anchorage.router.kv_events import KVEventSubscriber
            self._kv = KVEventSubscriber(self.state.queue_kv_events, cfg.kv_events_topic).start()
            self._kv.set_endpoints(self.state.kv_endpoints())
        if cfg.discovery == "kubernetes":
            self._start_discovery(loop)

    def _start_discovery(self, loop) -> None:
        from anchorage.router.discovery import KubeClientAPI, KubernetesSource
        cfg = self.cfg
        src = KubernetesSource(KubeClientAPI(cfg.k8s_kind), cfg.k8s_namespace,
                               cfg.k8s_selector, cfg.k8s_port, cfg.k8s_kind)

        def changed(urls: list[str]) -> None:      # on the watch thread
            # pod names (the addresses' targetRef) label the replicas' series
            loop.call_soon_threadsafe(self._apply_urls, urls, dict(src.pod_names))
        threading.Thread(target=src.watch, args=(changed,), daemon=True).start()

    def _apply_urls(self, urls: list[str], names: dict[str, str] | None = None) -> None:
        self.state.set_replicas(urls, names)
        if self._kv is not None:
            self._kv.set_endpoints(self.state.kv_endpoints())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._kv is not None:
            self._kv.stop()
        if self.session is not None:
            await self.session.close()

    # -- responses API: a follow-up goes where its previous response is stored ---------
    def pinned(self, p: parsing.Parsed) -> str | None:
        prev = p.body.get("previous_response_id") if p.path == "/v1/responses" else None
        return self.responses.get(prev) if isinstance(prev, str) else None

    def remember_response(self, content: bytes, url: str) -> None:
        try:
            rid = json.loads(content).get("id")
        except (ValueError, AttributeError):
            return
        if isinstance(rid, str) and len(rid) <= 256:
            self.responses[rid] = url

    # -- the request pipeline ---------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response:
        cfg = self.cfg
        try:
            limits.check_headers(request.scope["headers"], cfg)
            raw = await limits.read_body(request.stream(), cfg,
                                         request.headers.get("content-length"))
            headers = request.headers
            p = parsing.parse(path, raw, headers, cfg)
            keys, in_len, tpk = request_keys(p, cfg, self.tokenizer)
            m = p.meta
            ctx = RequestContext(request_id=next(self._ids), keys=keys, input_length=in_len,
                                 now_s=time.monotonic(), session_id=m.session_id,
                                 tenant=m.tenant, tool_name=m.tool_name, tool_args=m.tool_args,
                                 agent_hint=m.agent, warmup=m.warmup)
            fwd = json.dumps(to_vllm_body(p.body, m, p.salt)).encode()
            up_headers = {"content-type": "application/json", **self._auth,
                          "accept": headers.get("accept", "application/json")}
            return await retries.send(self, p, ctx, tpk, fwd, up_headers)
        except RouterError as exc:
            return self.error(exc)

    def error(self, exc: RouterError) -> Response:
        if exc.reason:
            self.state.rejected(exc.reason)
        return Response(exc.body(), status_code=exc.status, headers=exc.headers,
                        media_type="application/json")

    # -- other endpoints ----------------------------------------------------------------
    def models(self) -> Response:
        data = self.state.model_list()
        if not data and self.cfg.model:
            data = [{"id": self.cfg.model, "object": "model", "owned_by": "anchorage"}]
        if not data:
            return self.error(unavailable("no replica has reported its models yet"))
        return JSONResponse({"object": "list", "data": data})

    def healthz(self) -> Response:
        snap = self.state.snapshot()
        healthy = sum(1 for u in snap if u["healthy"])
        return JSONResponse({"status": "ok" if healthy else "no healthy replica",
                             "replicas": len(snap), "healthy": healthy},
                            status_code=200 if healthy else 503)

    def status(self) -> dict[str, Any]:
        return {"replicas": self.state.snapshot(),
                "sync": self.sync.status() if self.sync else None,
                "config": self.config_watch.status() if self.config_watch else None,
                "policy": self.cfg.policy}


NOT_FOUND = error_body("no such endpoint", "invalid_request_error", "not_found")
