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
import gc
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import aiohttp
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from anchorage.policies.base import RequestContext
from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.metadata import to_vllm_body
from anchorage.router import fastjson, health, limits, parsing, retries
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
        # replays after a dropped connection: a new connection each (``retries``)
        self.fresh_session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s,
                                             sock_read=cfg.read_timeout_s)
        self.sync = None
        self.config_watch = None
        self._tasks: list[asyncio.Task] = []
        self._pending_urls: list[str] | None = None
        self._kv = None
        self.pods = None

    # -- background --------------------------------------------------------------------
    async def start(self, peer_log=None) -> None:
        cfg = self.cfg
        reuse = aiohttp.TraceConfig()       # marks a request sent on a pooled connection
        reuse.on_connection_reuseconn.append(_mark_reused)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=cfg.max_connections, limit_per_host=cfg.max_connections, ttl_dns_cache=300),
            trace_configs=[reuse])
        self.fresh_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=cfg.max_connections, force_close=True, ttl_dns_cache=300))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(health.health_loop(self.state, self._auth)))
        if cfg.peers or cfg.peer_selector:
            from anchorage.router.pods import PodPeers
            self.pods = PodPeers(self.state, self.session, cfg.trusted_token,
                                 cfg.pod_id or os.environ.get("POD_NAME") or socket.gethostname(),
                                 cfg.peers, os.environ.get("POD_IP", ""))
            if cfg.peer_selector:
                self._start_peer_discovery(loop)
        if peer_log is not None:
            from anchorage.router.sync import PeerSync
            self.sync = PeerSync(self.state, peer_log, uuid.uuid4().hex[:12], cfg.sync_interval_s,
                                 self.pods)
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
        if cfg.gc_freeze_after_s > 0:
            self._tasks.append(loop.create_task(freeze_after(cfg.gc_freeze_after_s)))

    def _start_discovery(self, loop) -> None:
        # pod names (the addresses' targetRef) label the replicas' series
        self._watch(loop, self.cfg.k8s_selector, self.cfg.k8s_port, self._apply_urls)

    def _start_peer_discovery(self, loop) -> None:
        self._watch(loop, self.cfg.peer_selector, self.cfg.peer_port,
                    lambda urls, names: self.pods.set_peers(urls))

    def _watch(self, loop, selector: str, port: int, apply) -> None:
        """Follow the ready addresses of Endpoints selected by ``selector`` (a watch
        thread); ``apply(urls, pod_names)`` runs on the event loop on each change."""
        from anchorage.router.discovery import KubeClientAPI, KubernetesSource
        cfg = self.cfg
        src = KubernetesSource(KubeClientAPI(cfg.k8s_kind), cfg.k8s_namespace, selector, port,
                               cfg.k8s_kind)
        threading.Thread(target=src.watch, daemon=True, args=(
            lambda urls: loop.call_soon_threadsafe(apply, urls, dict(src.pod_names)),)).start()

    async def peer_push(self, request: Request) -> Response:
        """``POST /internal/v1/peer-decisions``: another router pod's decisions (``pods``)."""
        if self.pods is None or not self.pods.authorised(
                request.headers.get("x-anchorage-internal", "")):
            return self.error(RouterError(403, "peer decisions need the internal token",
                                          "permission_error", "forbidden", reason="forbidden"))
        try:
            raw = await limits.read_body(request.stream(), self.cfg,
                                         request.headers.get("content-length"))
            got = self.pods.parse(raw)
        except RouterError as exc:
            return self.error(exc)
        except (ValueError, RecursionError) as exc:
            return self.error(RouterError(400, f"bad decision batch: {exc}"))
        if got is not None:
            origin, payload, load = got
            if self.sync is not None:
                res = self.sync.log.ingest.remote(origin, payload, load)
                if hasattr(res, "__await__"):
                    await res
            elif payload:          # hosted without a log: apply here
                from anchorage.router.sync import decode
                for _, url, model, ctx in decode(payload):
                    self.state.on_peer_start(url, model, ctx)
        return Response(b"{}", media_type="application/json")

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
        if self.fresh_session is not None:
            await self.fresh_session.close()

    # -- responses API: a follow-up goes where its previous response is stored ---------
    def pinned(self, p: parsing.Parsed) -> str | None:
        prev = p.body.get("previous_response_id") if p.path == "/v1/responses" else None
        return self.responses.get(prev) if isinstance(prev, str) else None

    def remember_response(self, rid, url: str) -> None:
        if isinstance(rid, str) and len(rid) <= 256:
            self.responses[rid] = url

    # -- the request pipeline ---------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response:
        """One request, counted once in ``requests_total`` whatever its end: its last
        attempt's outcome, ``rejected`` (refused by the router before any replica),
        ``cancelled`` (the client left before any replica, e.g. while its body was read),
        ``server_error`` (the router failed); a stream when its relay ends."""
        tally = retries.Tally()
        try:
            return await self._handle(request, path, tally)
        except RouterError as exc:
            if tally.outcome is None:
                tally.outcome = "rejected"
            return self.error(exc)
        except ClientDisconnect:       # left while its body was read: nobody to answer
            tally.outcome = tally.outcome or "cancelled"
            return Response(CLIENT_LEFT, status_code=499, media_type="application/json")
        except BaseException as exc:
            if tally.outcome is None:
                tally.outcome = ("cancelled" if isinstance(exc, asyncio.CancelledError)
                                 else "server_error")
            raise
        finally:
            if not tally.deferred:
                self.state.count_request(tally.replica, tally.model,
                                         tally.outcome or "cancelled")

    async def _handle(self, request: Request, path: str, tally) -> Response:
        cfg = self.cfg
        limits.check_headers(request.scope["headers"], cfg)
        raw = await limits.read_body(request.stream(), cfg,
                                     request.headers.get("content-length"))
        headers = request.headers
        p = parsing.parse(path, raw, headers, cfg)
        tally.model = p.model
        keys, in_len, tpk = request_keys(p, cfg, self.tokenizer)
        m = p.meta
        ctx = RequestContext(request_id=next(self._ids), keys=keys, input_length=in_len,
                             now_s=time.monotonic(), session_id=m.session_id,
                             tenant=m.tenant, tool_name=m.tool_name, tool_args=m.tool_args,
                             agent_hint=m.agent, warmup=m.warmup)
        fwd = forward_body(p)
        up_headers = {"content-type": "application/json", **self._auth,
                      "accept": headers.get("accept", "application/json")}
        if p.stream:           # Starlette ends a stream whose client left
            return await retries.send(self, p, ctx, tpk, fwd, up_headers, tally)
        return await until_disconnect(request.receive,
                                      retries.send(self, p, ctx, tpk, fwd, up_headers, tally))

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
        return {"replicas": self.state.snapshot(), "ejections": dict(self.state.ejections),
                "sync": self.sync.status() if self.sync else None,
                "config": self.config_watch.status() if self.config_watch else None,
                "pods": self.pods.status() if self.pods else None,
                "policy": self.cfg.policy}


async def _mark_reused(session, trace_ctx, params) -> None:  # noqa: ARG001 - aiohttp's
    if isinstance(trace_ctx.trace_request_ctx, dict):
        trace_ctx.trace_request_ctx["reused"] = True


async def freeze_after(delay_s: float) -> None:
    """After warm-up, collect once and move every live object to the collector's
    permanent generation (``gc.freeze``): the routing tables built so far (prefix index,
    agent and thread tables: millions of entries) are then never walked by a full
    collection, whose pause grows with them."""
    await asyncio.sleep(delay_s)
    gc.collect()
    gc.freeze()
    log.info("routing state frozen for the cycle collector (%d objects)", gc.get_freeze_count())


_REWRITTEN = frozenset(("anchorage", "vllm_xargs", "session_id", "cache_salt"))


def forward_body(p: parsing.Parsed) -> bytes:
    """The body sent to the replica (``to_vllm_body``). When the client's body has none
    of the fields it rewrites, the canonical fields are appended to the client's own
    bytes (the same JSON object, not parsed and encoded again)."""
    body, m = p.body, p.meta
    if _REWRITTEN.isdisjoint(body):
        out = fastjson.extend_object(p.raw, to_vllm_body({}, m, p.salt))
        if out is not None:
            return out
    return fastjson.dumps(to_vllm_body(body, m, p.salt))


async def until_disconnect(receive, work) -> Response:
    """Await ``work`` (a non-streaming answer) unless the client disconnects first: then
    ``work`` is cancelled, which closes the upstream connection (vLLM aborts a request
    whose connection closes, so the engine stops computing it) and frees the attempt's
    slot at once (``retries.attempt`` reports it as ``cancelled``). The body has been read
    whole, so the next ASGI message is the disconnect."""
    me = asyncio.current_task()
    left = False

    async def watch() -> None:
        nonlocal left
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - no disconnect signal: the answer decides
            return
        left = True
        me.cancel()
    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if left and me.uncancel() == 0:         # our cancellation, not the server's
            return Response(CLIENT_LEFT, status_code=499, media_type="application/json")
        raise
    finally:
        watcher.cancel()


NOT_FOUND = error_body("no such endpoint", "invalid_request_error", "not_found")
CLIENT_LEFT = error_body("the client disconnected", "invalid_request_error", "client_closed")
