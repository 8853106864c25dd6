"""The sidecar's HTTP server (``node_agent.endpoints``: Starlette under uvicorn) as a client
sees it on loopback, raw bytes where a client library would hide the answer: the
endpoints' status codes and content types, bad requests answered without a traceback,
keep-alive, idle connections closed, an endpoint that raises answered 500."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from anchorage.node_agent import endpoints
from anchorage.node_agent.sidecar import Sidecar, SidecarConfig


async def raw(port: int, data: bytes, timeout_s: float = 10.0) -> tuple[str, dict, bytes]:
    """(status line, headers, body) of the answer to ``data``; ("", {}, b"") when the
    server closed without one."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(data)
        await w.drain()
        out = await asyncio.wait_for(r.read(), timeout_s)
    except ConnectionError:  # the server closed while the request was still being sent
        out = b""
    finally:
        w.close()
    if not out:
        return "", {}, b""
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdr = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return lines[0], hdr, body


def serve(tmp_path, body):
    """Run ``body(sidecar, base_url)`` against a started sidecar (no engine behind it)."""
    async def main():
        sc = Sidecar(SidecarConfig(engine_url="http://127.0.0.1:1", state_dir=str(tmp_path),
                                   port=0, policy_env="hybrid", access_log_port=0,
                                   access_log_token="tok"))
        await sc.start()
        try:
            await sc.tick()
            await body(sc, f"http://127.0.0.1:{sc.port}")
        finally:
            await sc.stop()
    asyncio.run(main())


def test_endpoints_status_codes_and_content_types(tmp_path):
    from prometheus_client import CONTENT_TYPE_LATEST

    async def body(sc, base):
        async with httpx.AsyncClient(base_url=base) as c:
            r = await c.get("/metrics?x=1")
            assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
            assert 'anchorage_policy_info{mode="stock",model_name="",policy="hybrid"} 1.0' in r.text
            r = await c.get("/healthz")
            assert (r.status_code, r.headers["content-type"], r.text) == (200, "text/plain", "ok\n")
            r = await c.get("/readyz")
            assert (r.status_code, r.text) == (503, "engine not answering\n")
            for path in ("/access-log", "/v1/access-log?drain=1"):
                assert (await c.get(path)).status_code == 404   # on its own port
            for path in ("/nope", "/healthz/", "/metrics/x"):
                r = await c.get(path)
                assert (r.status_code, r.headers["content-type"], r.text) == (
                    404, "text/plain", "not found\n"), path
            for method in ("POST", "PUT", "DELETE"):
                r = await c.request(method, "/healthz", content=b"{not json")
                assert (r.status_code, r.text) == (405, "only GET\n"), method
                assert "GET" in r.headers["allow"]
            r = await c.head("/healthz")
            assert r.status_code == 200 and r.content == b""
            # one connection serves many requests (the old server closed after each)
            ports = set()
            for _ in range(3):
                r = await c.get("/healthz")
                ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            assert len(ports) == 1

        logs = f"http://127.0.0.1:{sc.access_log_port}"
        auth = {"authorization": "Bearer tok"}
        async with httpx.AsyncClient(base_url=logs, headers=auth) as c:
            for path in ("/access-log", "/v1/access-log"):
                r = await c.get(path)
                assert r.status_code == 200
                assert r.headers["content-type"] == "application/x-ndjson"
                assert r.text.startswith('{"format":"anchorage-trace/v1"') and r.text.count("\n") == 1
                r = await c.post(path + "/drain")
                assert r.status_code == 200 and r.text.count("\n") == 1
                r = await c.get(path + "/drain")
                assert (r.status_code, r.text) == (405, "only POST\n")
                r = await c.post(path)
                assert (r.status_code, r.text) == (405, "only GET\n")
            r = await c.get("/v1/access-log?drain=1")
            assert r.status_code == 400 and "POST /v1/access-log/drain" in r.text
            for path in ("/metrics", "/healthz", "/nope"):
                assert (await c.get(path)).status_code == 404
            r = await c.get("/v1/access-log", headers={"authorization": ""})
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")

    serve(tmp_path, body)


def test_bad_requests_get_a_400_or_a_close_and_no_traceback(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(endpoints, "REQUEST_DEADLINE_S", 0.5)
    caplog.set_level(logging.DEBUG)

    async def body(sc, base):
        for data in (b"hello\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",
                     b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 1_000_000 + b"\r\n\r\n"):
            status, _, _ = await raw(sc.port, data)
            assert status in ("HTTP/1.1 400 Bad Request", ""), (data[:20], status)
        # a huge body on a POST: refused (405) unread; on a GET: ignored
        status, _, out = await raw(sc.port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Length: 20000000\r\n\r\n" + b"x" * 20_000_000)
        assert status in ("HTTP/1.1 405 Method Not Allowed", "")
        status, _, out = await raw(sc.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Length: 5\r\nConnection: close\r\n\r\n{bad!")
        assert (status, out) == ("HTTP/1.1 200 OK", b"ok\n")
        # a client that connects and sends nothing, or half a request, is let go
        for data in (b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"):
            assert await raw(sc.port, data, timeout_s=5) == ("", {}, b"")
        # the server still serves
        async with httpx.AsyncClient() as c:
            assert (await c.get(base + "/healthz")).status_code == 200

    serve(tmp_path, body)
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_an_endpoint_that_raises_is_a_500_and_the_server_serves_on(tmp_path, caplog):
    async def body(sc, base):
        def broken(now_s=None):
            raise RuntimeError("boom")
        sc.ready = broken
        async with httpx.AsyncClient() as c:
            r = await c.get(base + "/readyz")
            assert (r.status_code, r.headers["content-type"], r.text) == (
                500, "text/plain", "internal error\n")
            assert (await c.get(base + "/healthz")).status_code == 200

    serve(tmp_path, body)
    errs = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errs) == 1 and "error serving /readyz" in errs[0].getMessage()


def test_a_port_in_use_is_an_oserror_before_anything_starts(tmp_path):
    async def main():
        a = Sidecar(SidecarConfig(state_dir=str(tmp_path), port=0))
        await a.start()
        try:
            b = Sidecar(SidecarConfig(state_dir=str(tmp_path), port=a.port))
            with pytest.raises(OSError):
                await b.start()
            assert b._client is None   # nothing to close
        finally:
            await a.stop()
    asyncio.run(main())
