"""The Ray Serve app: an OpenAI-compatible proxy in front of vLLM replicas.

Per request: bound and parse the body (4xx with a clear message on bad input), read the
session (``x-session-id`` or ``session_id``), the tenant (a keyed hash of the API key; the
key itself is never stored or logged) and the metadata (docs/request-metadata.md), build
salted block keys, ask the shared ``RoutingState`` actor for a replica, and forward the
canonical body (``cache_salt`` per tenant, flat ``vllm_xargs``). Connect errors and 5xx
before the first byte are retried on another replica; SSE streams pass through chunk by
chunk; a replica that dies mid-stream ends the stream with an SSE error event. Usage
(``prompt_tokens_details.cached_tokens``) is reported back for the predicted-vs-observed
metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
from typing import Any

import httpx
import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from anchorage.policies.base import RequestContext
from anchorage.routing.keys import tenant_salt, text_block_keys, token_block_keys
from anchorage.routing.metadata import MetadataError, parse_request, to_vllm_body
from anchorage.router.config import RouterConfig
from anchorage.router.state import RoutingState


class _RelayResponse(StreamingResponse):
    """A streamed answer whose body generator is always closed when the response ends.

    Starlette stops iterating the body when the client disconnects but never closes it, so
    the generator's ``finally`` (which frees the replica in the routing state) would wait
    for the garbage collector; a cancelled generator sits in a reference cycle, so that can
    take arbitrarily long and leaves the replica counted as busy."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()

log = logging.getLogger("anchorage.router")
PROXIED = ("/v1/completions", "/v1/chat/completions")


@ray.remote(num_cpus=0)
class RoutingStateActor(RoutingState):
    """The named actor every router replica shares (see ``state.RoutingState``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self._discovery = None
        self._kv = None
        if self.cfg.kv_events or self.cfg.kv_events_port:
            from anchorage.router.kv_events import KVEventSubscriber
            self._kv = KVEventSubscriber(self.queue_kv_events, self.cfg.kv_events_topic).start()
            self._kv.set_endpoints(self.kv_endpoints())
        if self.cfg.discovery == "kubernetes":
            import threading

            from anchorage.router.discovery import KubeClientAPI, KubernetesSource
            src = KubernetesSource(KubeClientAPI(self.cfg.k8s_kind), self.cfg.k8s_namespace,
                                   self.cfg.k8s_selector, self.cfg.k8s_port, self.cfg.k8s_kind)
            self._discovery = src
            self._pending: list[str] | None = None
            threading.Thread(target=src.watch, args=(self._discovered,), daemon=True).start()

    def _discovered(self, urls: list[str]) -> None:
        # applied on the actor's thread at the next call; pod names label the series
        self._pending = (urls, dict(self._discovery.pod_names))

    def _apply_pending(self) -> None:
        if self._discovery is not None and self._pending is not None:
            (urls, names), self._pending = self._pending, None
            self.set_replicas(urls, names)
            if self._kv is not None:
                self._kv.set_endpoints(self.kv_endpoints())

    def pick(self, ctx, exclude=(), tokens_per_key=1.0):  # type: ignore[override]
        self._apply_pending()
        return super().pick(ctx, exclude, tokens_per_key)

    async def start(self) -> None:  # type: ignore[override]
        await super().start()


def get_state(cfg: RouterConfig):
    """The named routing-state actor, created on first use (one per Ray namespace)."""
    return RoutingStateActor.options(name=cfg.actor_name, get_if_exists=True,
                                     lifetime="detached", max_concurrency=1000).remote(cfg.__dict__)


def tenant_of(headers, secret: str) -> str | None:
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    if not key:
        return None
    return "t-" + hashlib.blake2b(key.encode(), key=secret.encode()[:64], digest_size=8).hexdigest()


def request_keys(body: dict[str, Any], path: str, cfg: RouterConfig, salt: str | None):
    """(block keys, prompt length estimate in tokens, tokens per key)."""
    if path == "/v1/chat/completions":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("'messages' must be a non-empty list")
        text = "".join(f"<{m.get('role')}>{m.get('content')}" if isinstance(m, dict) else str(m)
                       for m in msgs)
        prompt: Any = text
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise ValueError("'prompt' is required")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return token_block_keys(prompt, cfg.block_size, salt), len(prompt), float(cfg.block_size)
    if isinstance(prompt, str):
        if len(prompt) > cfg.max_prompt_chars:
            raise OverflowError(f"prompt is {len(prompt)} characters; the limit is {cfg.max_prompt_chars}")
        return (text_block_keys(prompt, cfg.chars_per_block, salt), len(prompt) // 4,
                cfg.chars_per_block / 4)
    raise ValueError("'prompt' must be a string or a list of token ids")


def _err(status: int, message: str, kind: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status, headers=headers)


def _usage_from_sse(buf: bytes) -> dict | None:
    usage = None
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                u = json.loads(line[6:]).get("usage")
            except ValueError:
                continue
            if u:
                usage = u
    return usage


def build_app(cfg: RouterConfig) -> FastAPI:
    api = FastAPI(title="anchorage router")

    @serve.deployment(name="anchorage-router", max_ongoing_requests=1000)
    @serve.ingress(api)
    class Router:
        def __init__(self, config: dict[str, Any]) -> None:
            self.cfg = RouterConfig(**config)
            self.state = get_state(self.cfg)
            self.state.start.remote()
            self.client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=self.cfg.max_connections,
                                    max_keepalive_connections=self.cfg.max_connections),
                timeout=httpx.Timeout(self.cfg.read_timeout_s, connect=self.cfg.connect_timeout_s))
            self._ids = itertools.count()
            self._auth = ({"authorization": f"Bearer {self.cfg.upstream_api_key}"}
                          if self.cfg.upstream_api_key else {})

        @api.get("/healthz")
        async def healthz(self) -> Response:
            snap = await self.state.snapshot.remote()
            healthy = sum(1 for u in snap if u["healthy"])
            return JSONResponse({"status": "ok" if healthy else "no healthy replica",
                                 "replicas": len(snap), "healthy": healthy},
                                status_code=200 if healthy else 503)

        @api.get("/livez")
        async def livez(self) -> Response:
            # Liveness: this replica answers HTTP. No engine or actor is consulted, so a
            # router waiting for its first engine is not restarted (readiness: /healthz).
            return JSONResponse({"status": "ok"})

        @api.get("/metrics")
        async def metrics(self) -> Response:
            return Response(await self.state.metrics_text.remote(),
                            media_type="text/plain; version=0.0.4")

        @api.get("/v1/models")
        async def models(self) -> Response:
            for u in await self.state.snapshot.remote():
                if not u["healthy"]:
                    continue
                try:
                    r = await self.client.get(u["url"] + "/v1/models", timeout=5, headers=self._auth)
                    if r.status_code == 200:
                        return Response(r.content, media_type="application/json")
                except httpx.HTTPError:
                    continue
            if self.cfg.model:
                return JSONResponse({"object": "list", "data": [
                    {"id": self.cfg.model, "object": "model", "owned_by": "anchorage"}]})
            return _err(503, "no healthy replica answered /v1/models", "unavailable")

        @api.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            return await self.proxy(request, "/v1/completions")

        @api.post("/v1/chat/completions")
        async def chat(self, request: Request) -> Response:
            return await self.proxy(request, "/v1/chat/completions")

        async def _reject(self, status: int, msg: str, kind: str, **kw) -> Response:
            self.state.rejected.remote(kind)
            return _err(status, msg, kind, **kw)

        async def proxy(self, request: Request, path: str) -> Response:
            cfg = self.cfg
            length = request.headers.get("content-length")
            if length and length.isdigit() and int(length) > cfg.max_body_bytes:
                return await self._reject(413, f"request body is {length} bytes; the limit is "
                                          f"{cfg.max_body_bytes}", "request_too_large")
            raw = b""
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > cfg.max_body_bytes:
                    return await self._reject(413, f"request body exceeds {cfg.max_body_bytes} bytes",
                                              "request_too_large")
            try:
                body = json.loads(raw)
            except ValueError:
                return await self._reject(400, "request body is not valid JSON", "invalid_request")
            if not isinstance(body, dict):
                return await self._reject(400, "request body must be a JSON object", "invalid_request")
            headers = {k.lower(): v for k, v in request.headers.items()}
            try:
                meta = parse_request(body, headers)
                meta.tenant = tenant_of(headers, cfg.tenant_secret)
                salt = tenant_salt(meta.tenant, cfg.tenant_secret)
                keys, in_len, tpk = request_keys(body, path, cfg, salt)
            except OverflowError as exc:
                return await self._reject(413, str(exc), "prompt_too_large")
            except (MetadataError, ValueError, TypeError) as exc:
                return await self._reject(400, str(exc), "invalid_request")
            ctx = RequestContext(request_id=next(self._ids), keys=keys, input_length=in_len,
                                 now_s=time.monotonic(), session_id=meta.session_id,
                                 tenant=meta.tenant, tool_name=meta.tool_name,
                                 tool_args=meta.tool_args, agent_hint=meta.agent,
                                 warmup=meta.warmup)
            fwd = json.dumps(to_vllm_body(body, meta, salt)).encode()
            stream = bool(body.get("stream"))
            tried: list[int] = []
            last_error = "no replica"
            for _attempt in range(cfg.retries + 1):
                d = await self.state.pick.remote(ctx, tried, tpk)
                if d["status"] == "saturated":
                    return await self._reject(
                        429, "every replica is at capacity; retry later", "saturated",
                        headers={"Retry-After": str(d["retry_after_s"])})
                if d["status"] != "ok":
                    break
                rid, url = d["replica"], d["url"]
                tried.append(rid)
                try:
                    req = self.client.build_request(
                        "POST", url + path, content=fwd,
                        headers={"content-type": "application/json", **self._auth,
                                 "accept": headers.get("accept", "application/json")})
                    resp = await self.client.send(req, stream=True)
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__} from a replica"
                    self.state.finish.remote(ctx, rid, "retried")
                    continue
                if resp.status_code >= 500:
                    await resp.aclose()
                    last_error = f"replica answered {resp.status_code}"
                    self.state.finish.remote(ctx, rid, "retried")
                    continue
                outcome = "ok" if resp.status_code < 400 else "client_error"
                if not stream or resp.status_code >= 400:
                    try:
                        content = await resp.aread()
                    except httpx.HTTPError:
                        self.state.finish.remote(ctx, rid, "upstream_error")
                        return _err(502, "replica failed while answering", "upstream_error")
                    finally:
                        await resp.aclose()
                    usage = None
                    if outcome == "ok":
                        try:
                            usage = json.loads(content).get("usage")
                        except (ValueError, AttributeError):
                            usage = None
                    self.state.finish.remote(ctx, rid, outcome, usage, d["predicted_tokens"])
                    return Response(content, status_code=resp.status_code,
                                    media_type=resp.headers.get("content-type", "application/json"))
                return _RelayResponse(self._relay(resp, ctx, rid, d["predicted_tokens"]),
                                      status_code=resp.status_code,
                                      media_type=resp.headers.get("content-type",
                                                                  "text/event-stream"))
            return await self._reject(503, f"no healthy replica could serve the request "
                                      f"({last_error})", "unavailable")

        async def _relay(self, resp: httpx.Response, ctx, rid: int, predicted: int):
            tail = b""
            outcome = "ok"
            first = True
            try:
                async for chunk in resp.aiter_raw():
                    if first:      # the first token: its prompt left the replica's queue
                        first = False
                        self.state.first_byte.remote(ctx, rid)
                    tail = (tail + chunk)[-8192:]
                    yield chunk
                if b"[DONE]" not in tail:
                    outcome = "upstream_error"
            except httpx.HTTPError:
                outcome = "upstream_error"
            except (GeneratorExit, asyncio.CancelledError):
                outcome = "cancelled"          # the client went away: not the replica's fault
                raise
            finally:
                # account first: the replica is freed even if closing the upstream stalls
                self.state.finish.remote(ctx, rid, outcome, _usage_from_sse(tail), predicted)
                try:
                    await asyncio.wait_for(resp.aclose(), timeout=5.0)
                except (asyncio.TimeoutError, httpx.HTTPError):
                    log.warning("upstream stream of request %s not closed cleanly", rid)
            if outcome != "ok":
                err = {"error": {"message": "the replica failed mid-stream", "type": "upstream_error"}}
                yield f"data: {json.dumps(err)}\n\n".encode()

    return Router.bind(cfg.__dict__)


def run(cfg: RouterConfig, host: str = "127.0.0.1", port: int = 8000, blocking: bool = True,
        route_prefix: str = "/") -> None:
    """Start (or join) Ray and Serve and deploy the router; used by ``anchorage router``."""
    cfg.validate()
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(cfg), name="anchorage-router", route_prefix=route_prefix,
              blocking=blocking)


def app_builder(args: dict[str, Any]):
    """Ray Serve application builder for KubeRay's ``RayService`` (``importPath:
    anchorage.router.app:app_builder``): ``args`` are ``RouterConfig`` fields, as the Helm
    chart renders them under ``serveConfigV2``. Unknown fields are a clear error."""
    from dataclasses import fields

    known = {f.name for f in fields(RouterConfig)}
    unknown = sorted(set(args or {}) - known)
    if unknown:
        raise ValueError(f"unknown router setting(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return build_app(RouterConfig(**(args or {})).validate())
