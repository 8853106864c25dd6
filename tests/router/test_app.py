"""The Ray Serve router on a real local Ray, in front of real HTTP upstreams (fake
OpenAI-compatible servers with injected faults)."""

from __future__ import annotations

import json
import re
import time

import pytest

BASE = {"policy": "agent", "block_size": 16, "health_interval_s": 0.5, "retries": 2,
        "eject_after_failures": 2, "tenant_secret": "test-secret"}


@pytest.fixture
def router(cluster):
    ns = cluster["ns"]
    ns("reset_upstreams")

    def deploy(**over):
        ns("deploy", {**BASE, "replicas": cluster["urls"], **over})
        return ns
    return deploy


def served_by(resp):
    return json.loads(resp["text"])["served_by"]


def metric(ns, name, **labels):
    text = ns("http", "GET", "/metrics")["text"]
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{name}(?:\{{(.*)\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def settled_metric(ns, name, expect, **labels):
    """The value once it reaches ``expect`` (finish/reject reports are fire-and-forget,
    so the shared state may lag the response by a moment); the last value otherwise."""
    deadline = time.time() + 10
    while True:
        v = metric(ns, name, **labels)
        if v == expect or time.time() > deadline:
            return v
        time.sleep(0.2)


def completion(ns, prompt, session=None, key="sk-alice", stream=False, **extra):
    headers = {"authorization": f"Bearer {key}"}
    if session:
        headers["x-session-id"] = session
    return ns("http", "POST", "/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                       "max_tokens": 3, "stream": stream, **extra},
              headers=headers)


def test_the_router_replica_and_its_haproxy_run_at_normal_priority(router):
    """Ray starts its workers at nice 15 unless told otherwise; a router on a node whose
    cores the engines keep busy then waits behind them on every request
    (``router.app.RAY_WORKER_PRIORITY``)."""
    ns = router()
    assert completion(ns, "hello")["status"] == 200
    nice = ns("niceness", "ServeReplica", "haproxy")
    assert nice["ServeReplica"] and nice["haproxy"], nice
    assert set(nice["ServeReplica"]) == {0} and set(nice["haproxy"]) == {0}, nice


def test_forwards_canonical_metadata_and_keeps_sessions_on_one_replica(router, cluster):
    ns = router()
    prompt = list(range(64))
    first = completion(ns, prompt, session="s1",
                       anchorage={"agent": "planner", "tool_name": "search", "tool_args": {"q": 1}})
    assert first["status"] == 200, first
    home = served_by(first)
    for turn in range(3):
        r = completion(ns, prompt + list(range(100, 120 + 16 * turn)), session="s1")
        assert r["status"] == 200 and served_by(r) == home
    body = ns("upstream_requests", home)[0]
    assert body["session_id"] == "s1"
    assert body["vllm_xargs"] == {"anchorage.agent": "planner", "anchorage.tool_name": "search",
                                  "anchorage.tool_args": '{"q": 1}',
                                  "anchorage.tenant": body["vllm_xargs"]["anchorage.tenant"]}
    assert "sk-alice" not in json.dumps(body) and "anchorage" not in body
    # observed cached tokens come from the upstream's usage; the router predicted hits too
    settled_metric(ns, "anchorage_router_requests_total", 4, policy="agent", outcome="ok")
    assert metric(ns, "anchorage_router_observed_cached_tokens_total") > 0
    assert metric(ns, "anchorage_router_predicted_cached_tokens_total") > 0
    assert settled_metric(ns, "anchorage_router_requests_total", 4, policy="agent", outcome="ok") == 4
    assert settled_metric(ns, "anchorage_router_decision_seconds_count", 4) == 4


def test_tenants_get_distinct_cache_salts(router):
    ns = router(policy="round_robin")
    completion(ns, [1] * 32, key="sk-alice")
    completion(ns, [1] * 32, key="sk-bob")
    completion(ns, [1] * 32, key="sk-alice")
    salts = [b["cache_salt"] for n in ns("upstream_names") for b in ns("upstream_requests", n)]
    assert len(salts) == 3 and len(set(salts)) == 2
    assert all("sk-" not in s for s in salts)


def test_chat_streaming_passes_sse_through(router):
    ns = router()
    r = ns("http", "POST", "/v1/chat/completions",
           json={"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi" * 50}]})
    assert r["status"] == 200 and r["headers"]["content-type"].startswith("text/event-stream")
    assert r["text"].count("data: ") == 5 and r["text"].rstrip().endswith("data: [DONE]")


def test_an_engines_5xx_goes_back_to_the_client_and_ejects_nothing(router, cluster):
    # a deterministic 5xx (e.g. chat on a model without a chat template) is the request's
    # failure: not retried on every replica, not counted against the replica
    ns = router(policy="round_robin", eject_after_failures=2)
    bad = cluster["names"][0]
    ns("set_mode", bad, "error500")
    out = [completion(ns, [i] * 32) for i in range(9)]
    assert [r["status"] for r in out].count(500) == 3, out
    five = next(r for r in out if r["status"] == 500)
    assert json.loads(five["text"])["error"]["message"] == "injected"   # the engine's own
    assert sum(len(ns("upstream_requests", n)) for n in cluster["names"]) == 9  # none twice
    assert all(u["healthy"] for u in ns("state_snapshot"))
    assert metric(ns, "anchorage_router_ejections_total") == 0
    assert metric(ns, "anchorage_router_requests_total", outcome="server_error") == 3


def test_connect_errors_are_retried_elsewhere_and_count_across_requests(router, cluster):
    ns = router(policy="round_robin", eject_after_failures=3, health_interval_s=60)
    dead = cluster["names"][1]
    ns("stop_upstream", dead)
    for i in range(4):
        r = completion(ns, [i] * 32)
        assert r["status"] == 200 and served_by(r) != dead
    snap = {u["url"]: u for u in ns("state_snapshot")}
    dead_url = cluster["urls"][1]
    assert snap[dead_url]["failures"] >= 1
    for i in range(6):
        completion(ns, [10 + i] * 32)
    assert not {u["url"]: u for u in ns("state_snapshot")}[dead_url]["healthy"]
    assert metric(ns, "anchorage_router_retries_total", reason="connect") >= 3


def test_mid_stream_death_ends_the_stream_with_an_error_event(router, cluster):
    ns = router(policy="round_robin", eject_after_failures=100)
    for n in cluster["names"]:
        ns("set_mode", n, "die_midstream")
    r = completion(ns, [5] * 32, stream=True)
    assert r["status"] == 200
    assert "[DONE]" not in r["text"] and '"upstream_error"' in r["text"]
    assert r["text"].count('"served_by"') == 2          # the two chunks sent before the drop
    assert metric(ns, "anchorage_router_requests_total", outcome="upstream_error") == 1


def test_client_leaving_mid_stream_frees_the_replica(router, cluster):
    ns = router(policy="round_robin")
    for n in cluster["names"]:
        ns("set_mode", n, "slow_stream", 1.0)
    first = ns("http_stream_then_leave", "/v1/completions",
               {"model": "tiny", "prompt": [1] * 32, "stream": True})
    assert '"served_by"' in first
    deadline = time.time() + 15
    while metric(ns, "anchorage_router_requests_total", outcome="cancelled") != 1:
        assert time.time() < deadline, ns("http", "GET", "/metrics")["text"]
        time.sleep(0.3)
    assert all(u["inflight"] == 0 and u["healthy"] for u in ns("state_snapshot"))


def test_every_replica_saturated_gives_429_with_retry_after(router, cluster):
    ns = router(policy="least_loaded", max_inflight_per_replica=1)
    for n in cluster["names"]:
        ns("set_mode", n, "slow", 3.0)
    slow = {"method": "POST", "path": "/v1/completions",
            "json": {"model": "tiny", "prompt": [1] * 32, "max_tokens": 1}}
    out = ns("http_with_background", [slow] * 3, slow, 1.5)
    assert out["fg"]["status"] == 429, out["fg"]
    assert out["fg"]["headers"]["retry-after"] == "1"
    assert "capacity" in json.loads(out["fg"]["text"])["error"]["message"]
    assert [b["status"] for b in out["bg"]] == [200, 200, 200]


BAD_REQUESTS = [
    ({"content": b"{not json"}, 400, "not valid JSON"),
    ({"json": [1, 2]}, 400, "JSON object"),
    ({"json": {"model": "tiny"}}, 400, "'prompt' is required"),
    ({"json": {"prompt": "x", "anchorage": {"agnet": "a"}}}, 400, "unknown anchorage metadata"),
    ({"json": {"prompt": {"x": 1}}}, 400, "string or a list of token ids"),
    ({"json": {"prompt": "x" * 5000}}, 413, "limit is 4096"),
]


def test_bad_requests_get_clear_4xx(router):
    ns = router(max_body_bytes=4096)
    for kwargs, status, msg in BAD_REQUESTS:
        r = ns("http", "POST", "/v1/completions", **kwargs)
        assert r["status"] == status and msg in json.loads(r["text"])["error"]["message"], r
    assert metric(ns, "anchorage_router_rejected_total", reason="invalid_request") == 5
    for kwargs, status, _ in BAD_REQUESTS:               # OpenAI error objects, code a string
        err = json.loads(ns("http", "POST", "/v1/completions", **kwargs)["text"])["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["code"], str)
    assert sum(len(ns("upstream_requests", n)) for n in ns("upstream_names")) == 0


def test_models_healthz_and_ejection_of_a_dead_replica(router, cluster):
    ns = router(policy="round_robin")
    assert json.loads(ns("http", "GET", "/v1/models")["text"])["data"][0]["id"] == "tiny"
    assert json.loads(ns("http", "GET", "/healthz")["text"])["healthy"] == 3
    dead = cluster["names"][2]
    ns("stop_upstream", dead)
    for i in range(6):                                 # connect errors are retried elsewhere
        r = completion(ns, [i] * 32)
        assert r["status"] == 200 and served_by(r) != dead
    deadline = time.time() + 10
    while json.loads(ns("http", "GET", "/healthz")["text"])["healthy"] != 2:
        assert time.time() < deadline, ns("state_snapshot")
        time.sleep(0.2)
    assert settled_metric(ns, "anchorage_router_ejections_total", 1) == 1
    ns("reset_upstreams")                               # restarts it: probes readmit it
    deadline = time.time() + 10
    while json.loads(ns("http", "GET", "/healthz")["text"])["healthy"] != 3:
        assert time.time() < deadline, ns("state_snapshot")
        time.sleep(0.2)


def test_queued_tokens_count_a_prompt_until_its_first_byte(router, cluster):
    ns = router(policy="round_robin")
    req = {"method": "POST", "path": "/v1/completions",
           "json": {"model": "tiny", "prompt": [5] * 64, "max_tokens": 3}}
    for n in cluster["names"]:
        ns("set_mode", n, "slow", 3.0)             # no byte for 3 s: still "prefilling"
    out = ns("snapshot_during", [req], 1.5)
    busy = [u for u in out["during"] if u["inflight"]]
    assert out["bg"] == [200] and len(busy) == 1 and busy[0]["queued_tokens"] == 64, out
    for n in cluster["names"]:
        ns("set_mode", n, "slow_stream", 1.0)      # first chunk at once, then slow
    stream = {**req, "json": {**req["json"], "prompt": [6] * 64, "stream": True}}
    out = ns("snapshot_during", [stream], 0.8)
    busy = [u for u in out["during"] if u["inflight"]]
    assert out["bg"] == [200] and len(busy) == 1 and busy[0]["queued_tokens"] == 0, out
    deadline = time.time() + 10
    while any(u["inflight"] or u["queued_tokens"] for u in ns("state_snapshot")):
        assert time.time() < deadline, ns("state_snapshot")
        time.sleep(0.2)
