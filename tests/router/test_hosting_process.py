"""The router hosted in one process without Ray (``anchorage.router.app.serve_process``),
started as the local stack starts it (``python -m anchorage.stack.router_main`` with
``hosting: process``, what ``anchorage up --router-hosting process`` writes) and as
``anchorage router --hosting process``, over a fake upstream on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest

from anchorage.router.app import shares_decisions
from anchorage.router.config import RouterConfig
from anchorage.stack.supervisor import descendants, http_ok
from tests.router.fake_upstream import FakeUpstream
from tests.support.procs import free_port, wait_until



async def wait_ready(url: str, proc: subprocess.Popen, log) -> None:
    """``wait_until`` on the router's /healthz, in a thread: the fake upstreams it
    health-checks run on this event loop."""
    await asyncio.to_thread(wait_until, lambda: http_ok(url + "/healthz"), "the router",
                            60.0, proc, log)


async def chat(s: aiohttp.ClientSession, url: str, text: str, session: str) -> tuple[int, bytes]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 3,
            "stream": True, "stream_options": {"include_usage": True}}
    async with s.post(url + "/v1/chat/completions", json=body,
                      headers={"x-session-id": session}) as r:
        return r.status, await r.read()


PROBES = [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-session-id: " + b"s" * 100_000
     + b"\r\nContent-Length: 2\r\n\r\n{}", 431),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-big: " + b"h" * 1_000_000
     + b"\r\nContent-Length: 2\r\n\r\n{}", 431),
    (b"GARBAGE\r\n\r\n", 400),
]


def raw(port: int, req: bytes) -> bytes:
    """Send ``req`` as it is; everything the server answers until it closes (or 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        try:
            c.sendall(req)
        except OSError:
            pass
        data = b""
        try:
            while True:
                got = c.recv(65536)
                if not got or (b"\r\n\r\n" in data + got and (data + got).rstrip().endswith(b"}")):
                    return data + got
                data += got
        except OSError:
            return data


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def test_the_stacks_one_process_router_routes_streams_and_stops(tmp_path):
    async def run() -> None:
        ups = [FakeUpstream("a"), FakeUpstream("b")]
        ports = [await u.start() for u in ups]
        port = free_port()
        spec = {"port": port, "hosting": "process", "router": {
            "replicas": [f"http://127.0.0.1:{p}" for p in ports], "policy": "agent",
            "model": "tiny", "health_interval_s": 0.5}}
        path = tmp_path / "router.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, "ANCHORAGE_TENANT_SECRET": "t" * 32}
        log = tmp_path / "router.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "anchorage.stack.router_main",
                                     str(path)], cwd=tmp_path, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url, proc, log)
            # no Ray: nothing below the router process (Ray would start its GCS, raylet
            # and workers there)
            assert descendants(proc.pid) == []
            async with aiohttp.ClientSession() as s:
                prefix = "the shared instructions of one agent " * 40
                answers = [await chat(s, url, prefix + f"turn {i}", "sess-1") for i in range(6)]
                assert all(st == 200 and b"data: [DONE]" in b for st, b in answers), answers
                # the agent policy keeps a session's turns on one replica
                served = [len(u.requests) for u in ups]
                assert sorted(served) == [0, 6], served
                async with s.post(url + "/v1/chat/completions", data=b"{not json") as r:
                    err = await r.json()
                    assert r.status == 400 and err["error"]["type"] == "invalid_request_error"
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                assert "anchorage_router_requests_total" in text and "sess-1" not in text
            # issue 45 item 3: what the HTTP server answers itself is an error object too
            # (uvicorn's text/plain "Invalid HTTP request received." before), and headers
            # of 100 KB and 1 MB reach the router, which answers 431
            for req, status in PROBES:
                got = await asyncio.to_thread(raw, port, req)
                head, _, body = got.partition(b"\r\n\r\n")
                assert head.startswith(f"HTTP/1.1 {status} ".encode()), got[:300]
                assert b"content-type: application/json" in head.lower(), got[:300]
                e = json.loads(body)["error"]
                assert set(e) == {"message", "type", "param", "code"}, e
            assert stop(proc) == 0
            out = log.read_text()
            assert "anchorage router ready" in out and "Traceback" not in out, out
            with pytest.raises(OSError):            # the port is closed with it
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
        finally:
            if proc.poll() is None:
                proc.kill()
            for u in ups:
                await u.stop()
    asyncio.run(run())


def test_anchorage_router_hosting_process_serves_one_replica_and_refuses_several(tmp_path):
    async def run() -> None:
        up = FakeUpstream("a")
        up_port = await up.start()
        port = free_port()
        env = dict(os.environ)
        argv = [sys.executable, "-m", "anchorage.cli", "router", "--hosting", "process",
                "--replicas", f"http://127.0.0.1:{up_port}", "--port", str(port)]
        many = subprocess.run(argv + ["--num-replicas", "2"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert many.returncode == 2 and "host it with Ray" in many.stderr
        assert many.stderr.count("\n") == 1 and "Traceback" not in many.stderr
        log = tmp_path / "router.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            await wait_ready(url, proc, log)
            async with aiohttp.ClientSession() as s:
                st, body = await chat(s, url, "hello there", "s")
                assert st == 200 and b"data: [DONE]" in body and len(up.requests) == 1
            assert stop(proc) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            await up.stop()
    asyncio.run(run())


def test_only_several_replicas_or_pod_peers_share_decisions():
    one = RouterConfig(replicas=["http://127.0.0.1:9"])
    assert not shares_decisions(one)
    assert shares_decisions(RouterConfig(replicas=["http://127.0.0.1:9"], num_replicas=2))
    assert shares_decisions(RouterConfig(replicas=["http://127.0.0.1:9"],
                                         peers=["http://127.0.0.1:10"]))
    assert shares_decisions(RouterConfig(replicas=["http://127.0.0.1:9"], peer_selector="a=b"))
