"""The node-agent sidecar's HTTP endpoints: a Starlette app, served by uvicorn inside the
sidecar's own event loop.

| request | answer |
|---|---|
| ``GET /metrics`` | 200, Prometheus text (``prometheus_client.CONTENT_TYPE_LATEST``) |
| ``GET /healthz`` | 200 ``ok`` (the process serves) |
| ``GET /readyz`` | 200 or 503, the reason as text (``Sidecar.ready``) |
| ``GET /v1/access-log``, ``GET /access-log`` | 200 ``application/x-ndjson``, anchorage-trace/v1; ``?drain=1`` (``true``, ``yes``) empties the buffer |
| any other path | 404 ``not found`` |
| another method on a known path | 405 ``only GET`` (``HEAD`` is ``GET`` without the body) |
| a request h11 cannot parse (not HTTP, oversized headers) | 400 (or the connection closed) |
| an endpoint that raises | 500 ``internal error`` (logged) |

Plain-text answers are ``text/plain`` with a trailing newline. Request bodies are never
read. A connection that has not sent a request line and headers within
``REQUEST_DEADLINE_S`` of connecting or of its previous answer is closed (uvicorn alone
would wait forever for a client that connects and sends nothing, or trickles bytes).
``HTTPServer`` binds its sockets itself (``socket.getaddrinfo`` over host and port,
as ``asyncio.start_server`` does), so a port in use is an ``OSError`` the CLI reports in
one line; uvicorn's own signal handlers are off: the sidecar owns SIGTERM/SIGINT (as vLLM's
API server does, ``vllm/entrypoints/launcher.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Awaitable, Callable, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

log = logging.getLogger("anchorage.node_agent.sidecar")

REQUEST_DEADLINE_S = 10.0
ACCESS_LOG_PATHS = ("/v1/access-log", "/access-log")
DRAIN_VALUES = ("1", "true", "yes")


class Served(Protocol):
    """What the endpoints read of the sidecar."""

    registry: object  # prometheus_client CollectorRegistry

    def ready(self) -> tuple[bool, str]: ...

    def access_log_text(self, drain: bool) -> str: ...


def text(status: int, body: str) -> Response:
    """A ``text/plain`` answer (no charset parameter: the contract since the first release)."""
    return Response(body + "\n", status_code=status, headers={"content-type": "text/plain"})


def _guarded(fn: Callable[[Request], Awaitable[Response]]):
    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception:  # noqa: BLE001 - one request fails, the server serves on
            log.exception("error serving %s", request.url.path)
            return text(500, "internal error")
    return endpoint


def build_app(sc: Served) -> Starlette:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(sc.registry), headers={"content-type": CONTENT_TYPE_LATEST})

    async def healthz(_: Request) -> Response:
        return text(200, "ok")

    async def readyz(_: Request) -> Response:
        ok, why = sc.ready()
        return text(200 if ok else 503, why)

    async def access_log(request: Request) -> Response:
        drain = request.query_params.get("drain", "0") in DRAIN_VALUES
        return Response(sc.access_log_text(drain).encode(),
                        headers={"content-type": "application/x-ndjson"})

    async def not_found(_: Request, __: HTTPException) -> Response:
        return text(404, "not found")

    async def not_allowed(_: Request, exc: HTTPException) -> Response:
        r = text(405, "only GET")
        r.headers.update(exc.headers or {})
        return r

    routes = [Route("/metrics", _guarded(metrics), methods=["GET"]),
              Route("/healthz", _guarded(healthz), methods=["GET"]),
              Route("/readyz", _guarded(readyz), methods=["GET"])]
    routes += [Route(p, _guarded(access_log), methods=["GET"]) for p in ACCESS_LOG_PATHS]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    app.router.redirect_slashes = False  # /healthz/ is not found, not a redirect
    return app


def _h11_with_deadline():
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class H11WithDeadline(H11Protocol):
        """uvicorn's h11 protocol; closes a connection that starts no request within
        ``REQUEST_DEADLINE_S`` of connecting or of its previous answer."""

        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            self._arm()  # before a pipelined request starts its cycle
            super().on_response_complete()

        def connection_lost(self, exc) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(REQUEST_DEADLINE_S, self._expire, self.cycle)

        def _expire(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.close()  # no new request since the deadline was set

    return H11WithDeadline


def bind(host: str, port: int, backlog: int = 100) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to (IPv6 ones v6-only), as
    ``asyncio.start_server(host=host, port=port)`` binds them; ``OSError`` when one cannot
    be bound (none is left open)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, addr in dict.fromkeys(infos):
            s = socket.socket(family, type_, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(addr)
            s.listen(backlog)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


class HTTPServer:
    """``app`` on ``host:port`` (port 0: any free one, see ``port``), in the running loop."""

    def __init__(self, app, host: str, port: int, graceful_s: float = 5.0) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):  # the sidecar handles SIGTERM/SIGINT
                yield

        self._socks = bind(host, port)
        self.port = self._socks[0].getsockname()[1]
        self._server = Server(uvicorn.Config(
            app, lifespan="off", http=_h11_with_deadline(), ws="none", log_config=None, log_level="warning",
            access_log=False, server_header=False, proxy_headers=False,
            timeout_graceful_shutdown=graceful_s))
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=self._socks))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        for s in self._socks:
            s.close()
