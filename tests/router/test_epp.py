"""The endpoint picker (``router/epp.py``) driven over loopback gRPC by a client that speaks
ext_proc as Envoy does in ``FULL_DUPLEX_STREAMED`` mode (``tests/router/epp_client.py``),
in front of fake OpenAI replicas (``fake_upstream``: /health, /metrics, /v1/models and a
toy prefix cache). The decisions are the router's own (``RoutingState``, the ``agent``
policy by default)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import grpc
import pytest

from tests.conftest import need_module

need_module("grpc_health", "grpcio-health-checking (the [router] extra)")
need_module("envoy.service.ext_proc.v3.external_processor_pb2", "xds-protos (the [router] extra)")

from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from anchorage.router.config import RouterConfig  # noqa: E402
from anchorage.router.epp import EppConfig, EppServer, hostport, parse_subset  # noqa: E402
from tests.router.test_epp_envoy import series  # noqa: E402
from tests.router.epp_client import Exchange, forward, request_headers  # noqa: E402
from tests.router.fake_upstream import FakeUpstream  # noqa: E402
from tests.support.procs import free_port  # noqa: E402

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Rig:
    def __init__(self, n: int = 2, **cfg) -> None:
        self.n, self.cfg_kw = n, cfg
        self.epp_kw = {k: cfg.pop(k) for k in list(cfg) if k in ("fallbacks",)}

    async def __aenter__(self) -> "Rig":
        self.ups = [FakeUpstream(c) for c in "abcdefgh"[: self.n]]
        self.ports = [await u.start() for u in self.ups]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        cfg = RouterConfig(replicas=list(self.urls), health_interval_s=0.2,
                           **self.cfg_kw).validate()
        self.srv = await EppServer(cfg, EppConfig(port=free_port(), **self.epp_kw)).start()
        self.state = self.srv.picker.state
        self.chan = grpc.aio.insecure_channel(f"127.0.0.1:{self.srv.ports['grpc']}")
        self.stub = epg.ExternalProcessorStub(self.chan)
        self.http = aiohttp.ClientSession()
        for _ in range(100):               # the first health round: models known
            if all(u.models for u in self.state.upstreams.values()):
                break
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.close()
        await self.chan.close()
        await self.srv.stop(0)
        for u in self.ups:
            await u.stop()

    def endpoint(self, name: str) -> str:
        return hostport(self.urls["abcdefgh".index(name)])

    def name_of(self, endpoint: str) -> str:
        return "abcdefgh"[[hostport(u) for u in self.urls].index(endpoint)]


def body(session: str, turn: int, model: str = "tiny", **kw) -> bytes:
    prompt = [7 if session == "s1" else 8] + list(range(100, 100 + 64 * (turn + 1)))
    return json.dumps({"model": model, "prompt": prompt, "max_tokens": 3,
                       "session_id": session, **kw}).encode()


def run(coro):
    return asyncio.run(coro)


def test_turns_of_a_session_stay_on_their_replica_header_and_metadata_agree():
    async def go():
        async with Rig(3) as r:
            homes: dict[str, set] = {"s1": set(), "s2": set()}
            for turn in range(4):
                for s in ("s1", "s2"):
                    p = await forward(r.stub, r.http, "/v1/completions", body(s, turn), chunks=3)
                    assert p.immediate is None
                    assert p.endpoint == p.metadata_endpoint and p.endpoint
                    assert p.clear_route_cache
                    assert int(p.set_headers["content-length"]) == len(p.body)
                    homes[s].add(p.endpoint.split(",")[0])
                    fwd = json.loads(p.body)          # the router's forward body
                    assert fwd["session_id"] == s and fwd["prompt"][0] == (7 if s == "s1" else 8)
                    assert p.response_body.startswith(b'{"id"')   # the answer echoed whole
            assert all(len(v) == 1 for v in homes.values()), homes
            for s, (ep,) in homes.items():
                up = r.ups["abc".index(r.name_of(ep))]
                assert all(q["session_id"] == s for q in up.requests if q["prompt"][0] ==
                           (7 if s == "s1" else 8))
            # every attempt ended: nothing left in flight, the answers' usage was read
            assert all(u.inflight == 0 and u.queued_tokens == 0 for u in r.state.upstreams.values())
            text = r.state.metrics_text().decode()
            assert 'outcome="ok"' in text
            observed = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("anchorage_router_observed_cached_tokens_total{"))
            assert observed > 0
    run(go())


def test_the_pick_comes_with_ranked_fallbacks_all_distinct():
    async def go():
        async with Rig(4, fallbacks=2) as r:
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers(), body("s1", 0))
            eps = p.endpoint.split(",")
            assert len(eps) == 3 and len(set(eps)) == 3
            assert set(eps) <= {r.endpoint(c) for c in "abcd"}
            # the pick is charged, the fallbacks are not
            busy = {hostport(u.url) for u in r.state.upstreams.values() if u.inflight}
            assert busy == {eps[0]}
            ex.cancel()
            await asyncio.sleep(0.1)
            assert all(u.inflight == 0 for u in r.state.upstreams.values())
        async with Rig(3, fallbacks=0) as r:
            p = await forward(r.stub, r.http, "/v1/completions", body("s1", 0))
            assert "," not in p.endpoint
    run(go())


def test_unknown_model_is_an_immediate_404_with_an_openai_error_body():
    async def go():
        async with Rig(2) as r:
            p = await forward(r.stub, r.http, "/v1/completions", body("s1", 0, model="nope"))
            assert p.status == 404
            err = json.loads(p.immediate.body)["error"]
            assert err["code"] == "model_not_found" and err["param"] == "model"
            assert err["type"] == "invalid_request_error" and "nope" in err["message"]
            hdrs = {h.header.key: h.header.raw_value for h in p.immediate.headers.set_headers}
            assert hdrs["content-type"] == b"application/json"
            assert all(len(u.requests) == 0 for u in r.ups)
    run(go())


@pytest.mark.parametrize("raw,code", [(b"{not json", "invalid_request"),
                                      (b"[1, 2]", "invalid_request"),
                                      (json.dumps({"model": "tiny", "prompt": 5}).encode(),
                                       "invalid_request"),
                                      (json.dumps({"model": "tiny", "prompt": [1], "n": 99}).encode(),
                                       "invalid_request")])
def test_malformed_requests_are_an_immediate_400(raw, code):
    async def go():
        async with Rig(2) as r:
            p = await forward(r.stub, r.http, "/v1/completions", raw)
            assert p.status == 400
            assert json.loads(p.immediate.body)["error"]["code"] == code
            assert r.state.metrics_text().count(b'reason="invalid_request"') >= 1
    run(go())


def test_no_endpoint_is_a_503_subset_hint_outside_the_pool_too():
    async def go():
        async with Rig(2) as r:
            p = await forward(r.stub, r.http, "/v1/completions", body("s1", 0),
                              subset=["10.9.9.9:8000"])
            assert p.status == 503
            assert json.loads(p.immediate.body)["error"]["code"] == "service_unavailable"
            for u in r.ups:                     # every replica down: ejected by health
                await u.kill()
            for _ in range(100):
                if not any(u.healthy for u in r.state.upstreams.values()):
                    break
                await asyncio.sleep(0.05)
            p = await forward(r.stub, r.http, "/v1/completions", body("s1", 0))
            assert p.status == 503
    run(go())


def test_the_subset_hint_is_honoured_list_or_comma_string_or_bare_ip():
    async def go():
        async with Rig(3) as r:
            for hint in ([r.endpoint("b")], r.endpoint("c") + "," + r.endpoint("b")):
                for turn in range(3):
                    p = await forward(r.stub, r.http, "/v1/completions", body(f"h{turn}", turn),
                                      subset=hint)
                    allowed = set(parse_subset(hint))
                    assert set(p.endpoint.split(",")) <= allowed, (p.endpoint, hint)
            p = await forward(r.stub, r.http, "/v1/completions", body("x", 0),
                              subset=["127.0.0.1"])            # an IP: any of its ports
            assert p.immediate is None and len(p.endpoint.split(",")) == 3
    run(go())


def test_a_gateway_fallback_moves_the_attempt_to_the_served_endpoint():
    async def go():
        async with Rig(3) as r:
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers(), body("s1", 0))
            first, second = p.endpoint.split(",")[:2]
            st = r.state
            async with r.http.post(f"http://{second}/v1/completions", data=p.body,
                                   headers={"content-type": "application/json"}) as resp:
                chunks = [await resp.read()]
            # the gateway reports where it went: the charge moves there at once
            await ex.send_response(200, {"content-type": "application/json"}, chunks, second)
            await ex.close()
            text = st.metrics_text().decode()
            name = {hostport(u.url): (u.name or u.url) for u in st.upstreams.values()}
            assert f'outcome="connect_error",policy="agent",replica="{name[first]}"' in text
            assert f'outcome="ok",policy="agent",replica="{name[second]}"' in text
            assert all(u.inflight == 0 for u in st.upstreams.values())
            # the session follows the replica that served it, as after the proxy's retry
            p = await forward(r.stub, r.http, "/v1/completions", body("s1", 1))
            assert p.endpoint.split(",")[0] == second
    run(go())


def test_streamed_answers_are_echoed_chunk_by_chunk_and_their_usage_read():
    async def go():
        async with Rig(2) as r:
            p = await forward(r.stub, r.http, "/v1/completions",
                              body("s1", 0, stream=True,
                                   stream_options={"include_usage": True}))
            assert p.immediate is None and p.response_body.endswith(b"data: [DONE]\n\n")
            text = r.state.metrics_text().decode()
            prompt = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("anchorage_router_prompt_tokens_total{"))
            assert prompt == 65
    run(go())


def test_a_stream_that_ends_before_the_answer_frees_its_slot():
    async def go():
        async with Rig(2, max_inflight_per_replica=1) as r:
            held = []
            for s in ("s1", "s2"):
                ex = Exchange(r.stub)
                p = await ex.send_request(request_headers(), body(s, 0))
                assert p.immediate is None
                held.append(ex)
            # both replicas at max_inflight_per_replica: a 429 with retry-after
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers(), body("s3", 0))
            assert p.status == 429
            hdrs = {h.header.key: h.header.raw_value for h in p.immediate.headers.set_headers}
            assert hdrs["retry-after"] == b"1"
            for h in held:
                h.cancel()
            await asyncio.sleep(0.2)
            assert all(u.inflight == 0 and u.queued_tokens == 0
                       for u in r.state.upstreams.values())
            assert series(r.state.metrics_text().decode(), "anchorage_router_requests_total",
                          outcome="cancelled") == 2
    run(go())


def test_a_body_over_the_limit_is_a_413_and_a_get_is_routed_without_accounting():
    async def go():
        async with Rig(2, max_body_bytes=1000) as r:
            p = await forward(r.stub, r.http, "/v1/completions", b"x" * 5000, chunks=5)
            assert p.status == 413
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers("/v1/models", "GET"), None)
            assert p.immediate is None and p.endpoint and "content-length" not in p.set_headers
            assert all(u.inflight == 0 for u in r.state.upstreams.values())
            await ex.close()
    run(go())


def test_large_bodies_arrive_in_many_chunks_and_go_back_in_62000_byte_ones():
    async def go():
        async with Rig(2, max_body_bytes=4 << 20) as r:
            raw = json.dumps({"model": "tiny", "prompt": "y" * 200_000, "max_tokens": 1,
                              "session_id": "big"}).encode()
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers(), raw, chunks=17)
            assert p.immediate is None and p.body_chunks == -(-len(p.body) // 62000)
            assert json.loads(p.body)["prompt"] == "y" * 200_000
            ex.cancel()
    run(go())


def test_health_liveness_and_readiness():
    async def go():
        async with Rig(2) as r:
            h = health_pb2_grpc.HealthStub(r.chan)
            for svc in ("liveness", "readiness", "", "envoy.service.ext_proc.v3.ExternalProcessor"):
                got = await h.Check(health_pb2.HealthCheckRequest(service=svc))
                assert got.status == SERVING, svc
            # a follower (leader election) is alive but not ready
            r.srv.readiness.set_leader(False)
            await asyncio.sleep(0.05)
            got = await h.Check(health_pb2.HealthCheckRequest(service="readiness"))
            assert got.status == NOT_SERVING
            got = await h.Check(health_pb2.HealthCheckRequest(service="liveness"))
            assert got.status == SERVING
            r.srv.readiness.set_leader(True)
            await asyncio.sleep(0.05)
            got = await h.Check(health_pb2.HealthCheckRequest(
                service="envoy.service.ext_proc.v3.ExternalProcessor"))
            assert got.status == SERVING
    run(go())


def test_the_cli_validates_epp_mode_and_prints_its_config():
    import os
    import subprocess
    import sys

    base = [sys.executable, "-m", "anchorage.cli", "router", "--mode", "epp"]
    ok = subprocess.run(base + ["--replicas", "http://10.0.0.1:8000", "--grpc-port", "9102",
                                "--fallbacks", "1", "--print-config"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["epp"]["port"] == 9102 and doc["epp"]["fallbacks"] == 1
    assert doc["replicas"] == ["http://10.0.0.1:8000"] and doc["discovery"] == "static"
    pool = subprocess.run(base + ["--pool-name", "p", "--pool-namespace", "llm",
                                  "--leader-election", "--print-config"],
                          capture_output=True, text=True, timeout=60)
    assert pool.returncode == 0, pool.stderr
    doc = json.loads(pool.stdout)
    assert doc["discovery"] == "inferencepool" and doc["epp"]["leader_election"]
    for bad, words in ((["--replicas", "http://a:1", "--num-replicas", "2"], "one process"),
                       (["--replicas", "http://a:1", "--pool-name", "p"], "not both"),
                       (["--replicas", "http://a:1", "--leader-election"], "InferencePool"),
                       (["--replicas", "http://a:1", "--fallbacks", "-1"], "fallbacks"),
                       ([], "at least one replica"),
                       (["--replicas", "http://a:1", "--epp-peers", "http://b:9"],
                        "leader election"),
                       (["--pool-name", "p", "--leader-election", "--epp-peers", "http://b:9"],
                        "metrics_port"),
                       (["--pool-name", "p", "--leader-election", "--metrics-port", "9090",
                         "--epp-peers", "http://b:9"], "internal token")):
        env = {k: v for k, v in os.environ.items() if k != "ANCHORAGE_INTERNAL_TOKEN"}
        r = subprocess.run(base + bad, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)


def test_a_gateway_in_another_body_mode_is_told_loudly(caplog):
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from anchorage.router import epp as m
    from tests.router.epp_client import header_map
    m._warned_mode = False
    picker = m.EndpointPicker(RouterConfig(replicas=["http://127.0.0.1:9"]).validate())
    req = ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(headers=header_map(request_headers())),
        protocol_config=ep.ProtocolConfiguration(request_body_mode=2))       # BUFFERED
    with caplog.at_level("ERROR", logger="anchorage.router.epp"):
        assert m.Stream(picker).on_message(req) == []
    assert "FULL_DUPLEX_STREAMED" in caplog.text


def test_recorded_envoy_cases_response_only_and_an_empty_end_of_stream_chunk():
    """Two sequences from llm-d-router's hermetic ext_proc tests
    (test/integration/epp/hermetic_test.go): a stream that starts at the response (a
    gateway's local reply, "no healthy upstream"), echoed untouched; and an SSE answer
    whose usage comes in the second chunk and whose end is an empty chunk."""
    async def go():
        async with Rig(2) as r:
            ex = Exchange(r.stub)
            p = await ex.send_response(503, {"content-type": "application/json"},
                                       [b"no healthy upstream"], None)
            assert p.response_body == b"no healthy upstream"
            await ex.close()
            ex = Exchange(r.stub)
            p = await ex.send_request(request_headers(), body("s1", 0, stream=True))
            sse = [b"data: {}\n\n",
                   b'data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}'
                   b"\n\ndata: [DONE]\n\n", b""]
            p = await ex.send_response(200, {"content-type": "text/event-stream"}, sse,
                                       p.endpoint.split(",")[0])
            assert p.response_body == b"".join(sse)
            await ex.close()
            text = r.state.metrics_text().decode()
            assert series(text, "anchorage_router_prompt_tokens_total") == 7
            assert series(text, "anchorage_router_requests_total", outcome="ok") == 1
            assert all(u.inflight == 0 for u in r.state.upstreams.values())
    run(go())
