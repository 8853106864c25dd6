"""The Ray Serve app: an OpenAI-compatible router in front of vLLM replicas.

Hosting. The app is one Serve deployment (``num_replicas`` router processes). With
``ingress="haproxy"`` (the default) Serve runs its HAProxy ingress and direct ingress
(``RAY_SERVE_ENABLE_HA_PROXY``, ``RAY_SERVE_THROUGHPUT_OPTIMIZED``: set by ``hosting_env``
in the environment Ray starts with): HAProxy on the Serve HTTP port balances client
connections over the router replicas (``RAY_SERVE_HAPROXY_BALANCE_ALGORITHM``, by session
header by default, so a session's turns meet the same replica), and each replica serves
HTTP itself: a request costs no actor call. With ``ingress="serve"`` Serve's own HTTP
proxy actor forwards each request to a replica (slower; for clusters started without
those variables). Locally Ray hosts it (``anchorage up`` / ``anchorage router``), in the
chart KubeRay does (``app_builder``).

Each replica routes from its own state (``core.RouterCore``); the replicas share their
decisions and in-flight counts through one named actor, off the request path (``sync``).

Endpoints: ``POST /v1/completions``, ``/v1/chat/completions``, ``/v1/responses``,
``/tokenize``, ``/detokenize`` (routed), ``GET /v1/models`` (every model some replica
serves), ``/livez`` (the process answers: liveness, no backend involved), ``/healthz``
(readiness: at least one healthy replica), ``/metrics`` (this process's series).
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from anchorage.router.config import RouterConfig
from anchorage.router.core import NOT_FOUND, RouterCore
from anchorage.router.parsing import ROUTED
from anchorage.router.relay import RelayResponse, _RelayResponse  # noqa: F401 - re-export

log = logging.getLogger("anchorage.router")
APP_NAME = "anchorage-router"


def build_asgi(core: RouterCore) -> Starlette:
    """The HTTP surface over one ``RouterCore`` (usable without Ray, e.g. under uvicorn)."""

    def routed(path: str):
        async def endpoint(request: Request) -> Response:
            return await core.handle(request, path)
        return endpoint

    async def models(request: Request) -> Response:
        return core.models()

    async def livez(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def healthz(request: Request) -> Response:
        return core.healthz()

    async def metrics(request: Request) -> Response:
        return Response(core.state.metrics_text(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return Response(NOT_FOUND, status_code=404, media_type="application/json")

    routes = [Route(p, routed(p), methods=["POST"]) for p in ROUTED]
    routes += [Route("/v1/models", models), Route("/livez", livez), Route("/healthz", healthz),
               Route("/metrics", metrics)]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def _deployment():
    from ray import serve

    @serve.deployment(name=APP_NAME, max_ongoing_requests=4096,
                      health_check_period_s=5, graceful_shutdown_timeout_s=10)
    @serve.ingress()
    class AnchorageRouter:
        def __init__(self, config: dict[str, Any]) -> None:
            self.core = RouterCore(RouterConfig(**config))

        async def __serve_build_asgi_app__(self):
            from anchorage.router.sync import actor
            cfg = self.core.cfg
            await self.core.start(actor(cfg.actor_name, cfg.sync_interval_s))
            return build_asgi(self.core)

        def snapshot(self) -> list[dict[str, Any]]:
            return self.core.state.snapshot()

        def status(self) -> dict[str, Any]:
            return self.core.status()

    return AnchorageRouter


def build_app(cfg: RouterConfig):
    return _deployment().options(num_replicas=cfg.num_replicas).bind(cfg.__dict__)


def hosting_env(cfg: RouterConfig, workdir: str | None = None) -> dict[str, str]:
    """Environment for the Ray that hosts the router (set before Ray starts): Serve's
    HAProxy ingress with direct ingress, its files in ``workdir`` (two stacks on one
    host do not share /tmp/haproxy-serve). Ray appends a 56-character folder to it and
    HAProxy's socket paths stop at 97 characters: keep ``workdir`` short."""
    if cfg.ingress != "haproxy":
        return {}
    d = workdir or tempfile.mkdtemp(prefix="ah-", dir="/tmp")   # Unix socket paths: short
    os.makedirs(d, exist_ok=True)
    return {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_HAPROXY_BALANCE_ALGORITHM": "hdr(x-session-id)",
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock",
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/metrics.sock",
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


def run(cfg: RouterConfig, host: str = "127.0.0.1", port: int = 8000, blocking: bool = True,
        route_prefix: str = "/") -> None:
    """Start (or join) Ray and Serve and deploy the router; used by ``anchorage router``."""
    from ray import serve

    cfg.validate()
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(cfg), name=APP_NAME, route_prefix=route_prefix, blocking=blocking)


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
