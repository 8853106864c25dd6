"""The node-agent sidecar's HTTP endpoints: two Starlette apps, served by uvicorn inside the
sidecar's own event loop.

The main app (``build_app``, ``--port``; Prometheus and the kubelet's probes reach it):

| request | answer |
|---|---|
| ``GET /metrics`` | 200, Prometheus text (``prometheus_client.CONTENT_TYPE_LATEST``) |
| ``GET /healthz`` | 200 ``ok`` (the process serves) |
| ``GET /readyz`` | 200 or 503, the reason as text (``Sidecar.ready``) |
| ``/v1/access-log``, ``/access-log`` | 404 (the access log is served on its own port) |

The access-log app (``build_access_log_app``, ``--access-log-port``; the chart's
NetworkPolicy admits only the operator to that port). The log holds every sampled tenant's
session ids, tool names and arguments, so each request needs the token the operator holds
(``Authorization: Bearer <token>``, ``ANCHORAGE_ACCESS_LOG_TOKEN``, compared in constant
time), and reading never changes it:

| request | answer |
|---|---|
| ``GET /v1/access-log``, ``GET /access-log`` | 200 ``application/x-ndjson``, anchorage-trace/v1 (header line, then records); the buffer is kept |
| ``GET`` with ``?drain=...`` | 400: draining is ``POST .../drain`` |
| ``POST /v1/access-log/drain``, ``POST /access-log/drain`` | 200, the same JSONL, then the buffer is emptied |
| no ``Authorization`` header (or not ``Bearer``) | 401 ``WWW-Authenticate: Bearer`` |
| a wrong token | 403 |

Both apps:

| request | answer |
|---|---|
| any other path | 404 ``not found`` |
| another method on a known path | 405 ``only GET`` (``only POST`` on ``.../drain``; ``HEAD`` is ``GET`` without the body) |
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
import hmac
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


class Served(Protocol):
    """What the main app reads of the sidecar."""

    registry: object  # prometheus_client CollectorRegistry

    def ready(self) -> tuple[bool, str]: ...


class AccessLogServed(Protocol):
    """What the access-log app reads of the sidecar."""

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


def _app(routes: list[Route]) -> Starlette:
    async def not_found(_: Request, __: HTTPException) -> Response:
        return text(404, "not found")

    async def not_allowed(_: Request, exc: HTTPException) -> Response:
        allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "GET")
        r = text(405, "only GET" if "GET" in allow else "only POST")
        r.headers.update(exc.headers or {})
        return r

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})
    app.router.redirect_slashes = False  # /healthz/ is not found, not a redirect
    return app


def build_app(sc: Served) -> Starlette:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(sc.registry), headers={"content-type": CONTENT_TYPE_LATEST})

    async def healthz(_: Request) -> Response:
        return text(200, "ok")

    async def readyz(_: Request) -> Response:
        ok, why = sc.ready()
        return text(200 if ok else 503, why)

    async def elsewhere(_: Request) -> Response:
        return text(404, "not found (the access log is served on its own port)")

    return _app([Route("/metrics", _guarded(metrics), methods=["GET"]),
                 Route("/healthz", _guarded(healthz), methods=["GET"]),
                 Route("/readyz", _guarded(readyz), methods=["GET"])]
                + [Route(p, elsewhere) for p in ACCESS_LOG_PATHS])


def authorized(headers, token: str) -> Response | None:
    """None when ``headers`` carry ``Authorization: Bearer <token>``; else the answer: 401
    without a bearer credential, 403 with a wrong one (and with no token configured)."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        r = text(401, "the access log needs the operator's token (Authorization: Bearer)")
        r.headers["www-authenticate"] = 'Bearer realm="anchorage-access-log"'
        return r
    if not token or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return text(403, "wrong access-log token")
    return None


def build_access_log_app(sc: AccessLogServed, token: str) -> Starlette:
    """The access log behind ``token`` (see the module's table)."""

    def answer(drain: bool) -> Response:
        return Response(sc.access_log_text(drain).encode(),
                        headers={"content-type": "application/x-ndjson"})

    async def read(request: Request) -> Response:
        denied = authorized(request.headers, token)
        if denied is not None:
            return denied
        if "drain" in request.query_params:
            return text(400, f"GET never empties the log: POST {request.url.path}/drain")
        return answer(False)

    async def drain(request: Request) -> Response:
        return authorized(request.headers, token) or answer(True)

    return _app([Route(p, _guarded(read), methods=["GET"]) for p in ACCESS_LOG_PATHS]
                + [Route(p + "/drain", _guarded(drain), methods=["POST"])
                   for p in ACCESS_LOG_PATHS])


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
