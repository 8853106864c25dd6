"""The router's own failures (issue 20), on a real local Ray behind Serve's HAProxy
ingress, in front of fake upstreams with injected faults. Each test failed before."""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from tests.router.test_app import BASE, completion, metric, served_by


@pytest.fixture
def router(cluster):
    ns = cluster["ns"]
    ns("reset_upstreams")

    def deploy(**over):
        ns("deploy", {**BASE, "replicas": cluster["urls"], **over})
        return ns
    return deploy


def err(r):
    return json.loads(r["text"])["error"]


def test_token_ids_outside_the_vocabulary_are_refused_at_the_edge(router, cluster):
    ns = router(policy="round_robin", vocab_size=1024)
    r = completion(ns, [5] * 31 + [1024])
    assert r["status"] == 400 and err(r)["code"] == "invalid_token_id", r
    assert "vocabulary" in err(r)["message"]
    assert completion(ns, [-1] * 32)["status"] == 400
    assert sum(len(ns("upstream_requests", n)) for n in cluster["names"]) == 0
    assert completion(ns, [1023] * 32)["status"] == 200


def test_a_request_that_killed_a_replica_is_not_replayed_on_the_next(router, cluster):
    ns = router(policy="round_robin")          # no vocabulary check: the engine dies
    for n in cluster["names"]:
        ns("set_mode", n, "poison")
    r = completion(ns, [5] * 31 + [4000])
    assert r["status"] == 500 and "EngineCore" in err(r)["message"]
    assert sum(len(ns("upstream_requests", n)) for n in cluster["names"]) == 1


def test_a_request_that_crashes_engines_is_answered_and_ejects_no_replica(router, cluster):
    """Issue 45 item 1: a request every engine fails by dropping the connection (a chat an
    engine cannot serve, which crashes it) is replayed once, then answered with a 502
    error object, and charged to no replica; another client's valid requests keep being
    served. Before, each drop counted against its replica: two such requests ejected two
    of three replicas, the third went with the next one, and valid requests got 503."""
    ns = router(policy="round_robin", eject_after_failures=2, health_interval_s=60)
    names = cluster["names"]
    for n in names:
        ns("set_mode", n, "drop_marked")
    crash = [999] + [5] * 31
    for i in range(8):
        before = [len(ns("upstream_requests", n)) for n in names]
        r = completion(ns, crash)
        assert r["status"] == 502, (i, r)
        assert err(r)["type"] == "upstream_error", r
        sent = [len(ns("upstream_requests", n)) - b for n, b in zip(names, before)]
        # one replay on another replica (plus, when the first attempt went over a pooled
        # connection, its one resend there over a new connection: stale_connection)
        assert sum(1 for k in sent if k) == 2 and sum(sent) <= 3, sent
        ok = completion(ns, [i + 1] * 32)                 # another client's valid request
        assert ok["status"] == 200, (i, ok)
    assert all(u["healthy"] for u in ns("state_snapshot")), ns("state_snapshot")
    assert metric(ns, "anchorage_router_ejections_total") == 0
    assert metric(ns, "anchorage_router_retries_total", reason="connection_lost") == 8
    assert "dropped the connection" in err(r)["message"], r


def test_a_replay_after_a_drop_goes_over_a_new_connection(router, cluster):
    """vLLM's server closes a connection after an error it did not handle (chat without a
    tokenizer: the real stack probe, tests/stack/test_stack_probe.py), so the router's
    pooled connection to it fails the next request sent on it. A valid request that met two
    such connections (its attempt and its replay) was a 502, and every such drop counted
    against the replica (the probe saw 5 ejections in 30 s). A request that fails on a
    pooled connection is sent again to the same replica over a new one, charging nobody."""
    ns = router(policy="round_robin", eject_after_failures=2, health_interval_s=60)
    for n in cluster["names"]:
        ns("set_mode", n, "stale")
    out = [completion(ns, [i + 1] * 32)["status"] for i in range(12)]
    assert out == [200] * 12, out
    assert metric(ns, "anchorage_router_retries_total", reason="stale_connection") >= 3
    assert metric(ns, "anchorage_router_retries_total", reason="connection_lost") == 0
    assert metric(ns, "anchorage_router_ejections_total") == 0


def test_a_replica_that_drops_requests_others_serve_is_ejected(router, cluster):
    """The other side of item 1: drops of distinct requests that then succeed elsewhere
    are the replica's fault, and eject it."""
    ns = router(policy="round_robin", eject_after_failures=2, health_interval_s=60)
    names, bad = cluster["names"], cluster["names"][0]
    ns("set_mode", bad, "reset")
    out = [completion(ns, [i + 1] * 32) for i in range(9)]
    assert [r["status"] for r in out] == [200] * 9
    assert all(served_by(r) != bad for r in out)
    snap = {u["url"]: u for u in ns("state_snapshot")}
    assert not snap[cluster["urls"][0]]["healthy"], snap
    assert metric(ns, "anchorage_router_ejections_total") == 1


def _drained(ns, timeout_s: float = 15.0) -> None:
    deadline = time.time() + timeout_s
    while any(u["inflight"] for u in ns("state_snapshot")):
        assert time.time() < deadline, ns("state_snapshot")
        time.sleep(0.2)


def test_clients_that_give_up_leak_no_in_flight_slot(router, cluster):
    """More clients give up than there are slots (3 replicas x 2): if each give-up leaked
    its slot, the router would refuse everything after. Each round starts with every slot
    free (drained, not a fixed sleep: the precondition must not depend on timing)."""
    ns = router(policy="round_robin", max_inflight_per_replica=2)
    slots = 2 * len(cluster["names"])
    for n in cluster["names"]:
        ns("set_mode", n, "slow", 1.5)
    gave_up = 0
    for _ in range(3):                        # each round would leak every slot
        _drained(ns)
        out = ns("http_many_timeouts", 12, "/v1/completions",
                 {"model": "tiny", "prompt": [1] * 32, "max_tokens": 1}, 0.3)
        assert set(out) <= {"ReadTimeout", "429"} and "ReadTimeout" in out, out
        gave_up += out.count("ReadTimeout")
    assert gave_up > slots, gave_up
    _drained(ns)
    for n in cluster["names"]:
        ns("set_mode", n, "ok")
    assert completion(ns, [2] * 32)["status"] == 200


def test_a_client_that_leaves_aborts_its_upstream_request(router, cluster):
    """A non-streaming client that disconnects cancels the upstream request (the engine
    stops computing it, as vLLM aborts a request whose connection closes) and frees its
    slot at once, not when the answer would have arrived (15 s here)."""
    ns = router(policy="round_robin")
    for n in cluster["names"]:
        ns("set_mode", n, "slow", 15.0)
    reached = ns("http_sent_then_leave", 3, "/v1/completions",
                 {"model": "tiny", "prompt": [1] * 32, "max_tokens": 1})
    assert reached == 3
    t0 = time.time()
    aborts = lambda: sum(ns("upstream_aborts", n) for n in cluster["names"])  # noqa: E731
    while aborts() < reached:
        assert time.time() - t0 < 12, aborts()
        time.sleep(0.1)
    assert not any(u["inflight"] for u in ns("state_snapshot"))
    assert metric(ns, "anchorage_router_requests_total", outcome="cancelled") == 3


def test_every_request_is_counted_once_with_one_outcome(router, cluster):
    """Issue 45 item 7: ``requests_total`` counts every request exactly once, with the
    outcome it ended in: served, refused by the router, replayed after a drop (one sample,
    not one per attempt), and abandoned in every way a client can leave: while its body is
    read, while the replica computes, mid-stream. Before, the refused and the abandoned
    mid-body were not counted and a replayed request counted twice."""
    ns = router(policy="round_robin", body_timeout_s=1.0, health_interval_s=60)
    names = cluster["names"]
    total = lambda **kw: metric(ns, "anchorage_router_requests_total", **kw)  # noqa: E731
    before = total()
    for i in range(3):
        assert completion(ns, [i + 1] * 32)["status"] == 200                     # ok x3
    assert completion(ns, [True, 3])["status"] == 400                            # rejected
    assert ns("http", "POST", "/v1/completions", content=b"{no")["status"] == 400  # rejected
    ns("http_partial_body", "/v1/completions", 100, b'{"prompt": [1,')          # 408: rejected
    ns("set_mode", names[0], "drop_marked")
    ns("set_mode", names[1], "drop_marked")
    ns("set_mode", names[2], "drop_marked")
    assert completion(ns, [999] + [5] * 31)["status"] == 502                     # upstream_error
    ns("http_partial_then_leave", "/v1/completions", 2)                          # cancelled x2
    for n in names:
        ns("set_mode", n, "slow", 10.0)
    assert ns("http_sent_then_leave", 2, "/v1/completions",
              {"model": "tiny", "prompt": [7] * 32, "max_tokens": 1}) == 2       # cancelled x2
    for n in names:
        ns("set_mode", n, "slow_stream", 1.0)
    ns("http_stream_then_leave", "/v1/completions",
       {"model": "tiny", "prompt": [8] * 32, "max_tokens": 3, "stream": True})  # cancelled
    want = {"ok": 3, "rejected": 3, "upstream_error": 1, "cancelled": 5}
    deadline = time.time() + 20
    while True:
        got = {o: total(outcome=o) for o in want}
        if got == want and total() - before == sum(want.values()) or time.time() > deadline:
            break
        time.sleep(0.3)
    assert got == want and total() - before == sum(want.values()), (got, total() - before)
    assert total(outcome="cancelled", replica="none") == 2     # they reached no replica


LIMITS = [
    ({"headers": {"x-session-id": "s" * 1000}}, 400, "the session id is 1000 characters"),
    ({"json": {"model": "tiny", "prompt": [1] * 32, "n": 1000}}, 400, "'n' must be"),
    ({"content": b"[" * 10000 + b"]" * 10000}, 400, "nested deeper"),
    ({"content": b'{"prompt": ' + b"[" * 200 + b"]" * 200 + b"}"}, 400, "nested deeper"),
    ({"json": {"prompt": [1] * 32, "anchorage": {"agent": "a" * 5000}}}, 400,
     "anchorage.agent is 5000"),
    ({"headers": {"x-big": "h" * 20000}, "json": {"prompt": [1] * 32}}, (400, 431), ""),
    # issue 45 item 4: types checked strictly (vLLM's lax parser reads true as 1)
    ({"json": {"model": "tiny", "prompt": [True, 3]}}, 400, "'prompt' must be"),
    ({"json": {"model": "tiny", "prompt": [[1, 2], [True]]}}, 400, "'prompt' must be"),
    ({"json": {"model": "tiny", "prompt": {"a": 1}}}, 400, "'prompt' must be"),
    ({"json": {"model": "tiny", "prompt": [1] * 32, "anchorage": {"warmup": "yes"}}}, 400,
     "anchorage.warmup must be a boolean"),
    ({"json": {"model": "tiny", "prompt": [1] * 32, "stream": "yes"}}, 400,
     "'stream' must be a boolean"),
]


def test_limits_on_headers_ids_n_and_nesting(router, cluster):
    ns = router(policy="round_robin")
    for kwargs, status, msg in LIMITS:
        kw = dict(kwargs)
        if "json" not in kw and "content" not in kw:
            kw["json"] = {"model": "tiny", "prompt": [1] * 32}
        r = ns("http", "POST", "/v1/completions", **kw)
        ok = r["status"] in status if isinstance(status, tuple) else r["status"] == status
        assert ok, (kwargs.keys(), r["status"], r["text"][:300])
        if msg:
            assert msg in err(r)["message"], r["text"][:300]
    assert sum(len(ns("upstream_requests", n)) for n in cluster["names"]) == 0


def test_a_body_that_stops_midway_times_out(router):
    ns = router(policy="round_robin", body_timeout_s=1.0)
    t0 = time.time()
    line = ns("http_partial_body", "/v1/completions", 100, b'{"prompt": [1,')
    assert " 408 " in line + " " or line.startswith("HTTP/1.1 408"), line
    assert time.time() - t0 < 8


def test_only_trusted_callers_mark_warmups(router, cluster):
    ns = router(policy="round_robin", trusted_token="sidecar-token")
    completion(ns, [1] * 32, anchorage={"warmup": True})
    ns("http", "POST", "/v1/completions", headers={"x-anchorage-internal": "sidecar-token"},
       json={"model": "tiny", "prompt": [2] * 32, "anchorage": {"warmup": True}})
    bodies = [b for n in cluster["names"] for b in ns("upstream_requests", n)]
    marks = {b["prompt"][0]: (b.get("vllm_xargs") or {}).get("anchorage.warmup") for b in bodies}
    assert marks == {1: None, 2: 1}


def test_routes_by_model_and_lists_every_model(router, cluster):
    ns = cluster["ns"]
    ns("reset_upstreams")
    other = cluster["names"][2]
    ns("set_models", other, ["other"])
    ns("deploy", {**BASE, "replicas": cluster["urls"], "policy": "round_robin"})
    ids = sorted(m["id"] for m in json.loads(ns("http", "GET", "/v1/models")["text"])["data"])
    assert ids == ["other", "tiny"]
    for i in range(4):
        assert served_by(completion(ns, [i] * 32, model="other")) == other
        assert served_by(completion(ns, [i] * 32)) != other
    r = completion(ns, [1] * 32, model="gpt-9")
    assert r["status"] == 404 and err(r) == {"message": "The model `gpt-9` does not exist.",
                                             "type": "invalid_request_error", "param": "model",
                                             "code": "model_not_found"}


def test_responses_tokenize_are_routed_and_follow_ups_find_their_replica(router, cluster):
    ns = router(policy="round_robin")
    first = ns("http", "POST", "/v1/responses", json={"model": "tiny", "input": "hello " * 40})
    assert first["status"] == 200, first
    home, rid = served_by(first), json.loads(first["text"])["id"]
    for _ in range(4):
        r = ns("http", "POST", "/v1/responses", json={"model": "tiny", "input": "more",
                                                      "previous_response_id": rid})
        assert served_by(r) == home
    tok = ns("http", "POST", "/tokenize", json={"model": "tiny", "prompt": "abc"})
    assert tok["status"] == 200 and served_by(tok) in cluster["names"]


def test_killing_an_engine_under_load_loses_no_request(router, cluster):
    ns = router(policy="round_robin", eject_after_failures=2)
    for n in cluster["names"]:
        ns("set_mode", n, "slow", 0.3)
    out = ns("load_during_kill", cluster["names"][1], 60, 12, kill_after_s=0.1)
    assert [r["status"] for r in out] == [200] * 60, [r["status"] for r in out]
    assert metric(ns, "anchorage_router_retries_total", reason="connection_lost") >= 1


def test_a_request_an_engine_aborted_is_replayed_once_on_another(router, cluster):
    """vLLM answers 200 with finish_reason "abort" for the requests in flight when its
    engine shuts down (a pod deleted mid-workload): the router replays it once elsewhere,
    as for a connection lost; aborted twice, the second answer goes to the client."""
    ns = router(policy="round_robin")
    names = cluster["names"]
    ns("set_mode", names[0], "abort")
    before = metric(ns, "anchorage_router_retries_total", reason="aborted")
    outs = [completion(ns, [5] * 32) for _ in range(6)]
    assert [r["status"] for r in outs] == [200] * 6

    def reason(r):
        return json.loads(r["text"])["choices"][0].get("finish_reason")
    assert all(reason(r) != "abort" for r in outs), outs
    replays = metric(ns, "anchorage_router_retries_total", reason="aborted") - before
    assert replays >= 1
    assert sum(len(ns("upstream_requests", n)) for n in names) == 6 + replays
    for n in names:
        ns("set_mode", n, "abort")
    r = completion(ns, [6] * 32)
    assert r["status"] == 200 and reason(r) == "abort"     # replayed once, then passed on
    assert sum(len(ns("upstream_requests", n)) for n in names) == 6 + replays + 2


def test_routing_policy_follows_the_operators_document(router, tmp_path, cluster):
    doc = str(tmp_path / "anchorage.yaml")
    ns = cluster["ns"]
    ns("write_file", doc, "generation: 1\npolicy: {name: hybrid}\n"
                          "routing: {policy: round_robin, weights: {}}\n...\n")
    ns = router(policy="agent", config_file=doc, config_poll_s=0.2)

    def policy():
        deadline = time.time() + 10
        while True:
            st = ns("router_status")
            if time.time() > deadline or st["config"]["generation"]:
                return st
            time.sleep(0.2)
    st = policy()
    assert st["policy"] == "round_robin" and st["config"]["generation"] == {"*": 1}
    served = {served_by(completion(ns, [7] * 32, session="s")) for _ in range(6)}
    assert len(served) == 3                            # round robin ignores the session
    ns("write_file", doc, "generation: 2\npolicy: {name: hybrid}\nrouting: {policy: composite, "
                          "weights: {session: 5, queue: 1}}\n...\n")
    time.sleep(1.0)
    assert ns("router_status")["policy"] == "composite"
    # cut short (no end marker): refused like any invalid document, the policy kept
    ns("write_file", doc, "generation: 3\npolicy: {name: hybrid}\nrouting: {policy: round_")
    time.sleep(1.0)
    st = ns("router_status")
    assert st["policy"] == "composite" and "end marker" in st["config"]["errors"]["*"]
    ns("write_file", doc, "")                          # emptied: refused, policy kept
    time.sleep(1.0)
    st = ns("router_status")
    assert st["policy"] == "composite" and "empty" in st["config"]["errors"]["*"]
    assert metric(ns, "anchorage_router_config_rejected_total") == 2
    assert len({served_by(completion(ns, [8] * 32, session="t")) for _ in range(5)}) == 1


def test_livez_needs_no_backend(router, cluster):
    ns = router(policy="round_robin")
    for n in cluster["names"]:
        ns("stop_upstream", n)
    deadline = time.time() + 10
    while ns("http", "GET", "/healthz")["status"] != 503:
        assert time.time() < deadline
        time.sleep(0.2)
    assert ns("http", "GET", "/livez")["status"] == 200


def test_two_router_replicas_share_their_decisions(router, cluster):
    ns = router(policy="agent", num_replicas=2)
    for i in range(40):
        assert completion(ns, [i % 5] * 64)["status"] == 200
    time.sleep(0.5)
    sts = ns("statuses_of_replicas")
    assert len(sts) == 2
    assert all(s["sync"]["applied"] > 0 for s in sts), [s["sync"] for s in sts]


def test_the_local_router_listens_on_loopback_only(router, cluster):
    """Serve's HAProxy template binds its stats page (8404, no authentication) and its
    Prometheus exporter (9101) on every interface; a local router (``hosting_env``: the
    wrapper of ``router.ingress``) runs HAProxy without them (issue 45 item 6), its
    frontend on loopback, and the router replicas serve HTTP on loopback. (Ray Serve
    binds each replica's inter-deployment gRPC server to ``[::]:0`` in code, with no
    setting: the one IPv6 wildcard left, tracked with Ray's other sockets in issue 21
    item 6.)"""
    ns = router(policy="round_robin")
    socks = ns("listening_sockets")
    ingress = [s for s in socks if "haproxy" in s["cmd"]]
    assert 8000 in {s["port"] for s in ingress}, socks
    assert not {8404, 9101} & {s["port"] for s in socks}, ingress
    assert [s for s in ingress if not _loopback(s["addr"])] == [], ingress
    replica = [s for s in socks if "ServeReplica" in s["cmd"]]
    assert any(_loopback(s["addr"]) for s in replica), socks
    assert [s for s in replica if s["addr"] == "0.0.0.0"] == [], replica


def test_two_local_routers_on_one_machine_do_not_clash(cluster):
    """Issue 45 item 6: two more routers with their own Ray and HAProxy, beside the session's,
    on Ray's default ports apart from their HTTP port (as a second `anchorage up` on the
    same machine): all three serve. Before, the second HAProxy could not bind 8404."""
    ns = cluster["ns"]
    ns("reset_upstreams")
    spec = {**BASE, "replicas": cluster["urls"], "policy": "round_robin"}
    try:
        pods = [ns("start_router_pod", port, spec, moved=False) for port in (8100, 8200)]
        for url in pods:
            r = ns("http_at", url, "POST", "/v1/completions",
                   json={"model": "tiny", "prompt": [3] * 32, "max_tokens": 1})
            assert r["status"] == 200, (url, r)
        haproxies = [s for s in ns("listening_sockets") if "haproxy" in s["cmd"]]
        assert {8100, 8200} <= {s["port"] for s in haproxies}, haproxies
        assert not {8404, 9101} & {s["port"] for s in haproxies}, haproxies
    finally:
        ns("stop_router_pods")


def test_the_ingress_answers_its_own_errors_with_error_objects(router, cluster):
    """Issue 45 item 3, the errors HAProxy answers itself after parsing a request: no app
    deployed (a router restarting) is Serve's text/plain 404, now an OpenAI error object;
    so is Serve's /-/healthz 503 and its 502-504 (text/plain 500 before)."""
    ns = router(policy="round_robin")
    ns("serve_delete")
    r = ns("http", "POST", "/v1/completions", json={"model": "tiny", "prompt": [1] * 32})
    assert r["status"] == 404 and r["headers"]["content-type"] == "application/json", r
    assert set(err(r)) == {"message", "type", "param", "code"}
    h = ns("http", "GET", "/-/healthz")
    assert h["headers"]["content-type"] == "application/json" or h["status"] < 400, h


def _loopback(addr: str) -> bool:
    a = ipaddress.ip_address(addr)
    return a.is_loopback or bool(getattr(a, "ipv4_mapped", None) and a.ipv4_mapped.is_loopback)
