"""The shared routing state without Ray: admission, ejection, readmission, metrics."""

import asyncio
import time

import httpx
import pytest

from anchorage.policies.base import RequestContext
from anchorage.router.config import RouterConfig
from anchorage.router.health import probe_once
from anchorage.router.state import RoutingState, parse_vllm_gauges

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]


def ctx(i=0, session=None):
    return RequestContext(request_id=i, keys=[1, 2, 3], input_length=48, session_id=session)


def state(**kw):
    return RoutingState(RouterConfig(replicas=URLS, **kw).validate())


def test_admission_saturates_then_frees():
    s = state(policy="round_robin", max_inflight_per_replica=1)
    a, b = s.pick(ctx()), s.pick(ctx())
    assert {a["replica"], b["replica"]} == {0, 1}
    assert s.pick(ctx()) == {"status": "saturated", "retry_after_s": 1}
    s.finish(ctx(), a["replica"], "ok", {"prompt_tokens": 48,
                                         "prompt_tokens_details": {"cached_tokens": 32}}, 16)
    assert s.pick(ctx())["replica"] == a["replica"]
    text = s.metrics_text().decode()
    assert 'anchorage_router_observed_cached_tokens_total{replica="http://127.0.0.1:1"} 32.0' in text
    assert 'anchorage_router_predicted_cached_tokens_total{replica="http://127.0.0.1:1"} 16.0' in text
    assert 'outcome="ok",policy="round_robin",replica="http://127.0.0.1:1"' in text


def test_passive_failures_eject_and_exclusion_retries_elsewhere():
    s = state(policy="round_robin", eject_after_failures=2)
    for _ in range(2):
        d = s.pick(ctx(), exclude=[1])
        assert d["replica"] == 0
        s.finish(ctx(), 0, "connect_error")
    assert [u["healthy"] for u in s.snapshot()] == [False, True]
    assert s.pick(ctx(), exclude=[1]) == {"status": "unavailable"}
    assert "anchorage_router_ejections_total" in s.metrics_text().decode()


def test_probes_readmit_and_read_vllm_gauges():
    s = state(policy="least_loaded", eject_after_failures=1)
    s.finish(ctx(), 0, "upstream_error")
    assert not s.snapshot()[0]["healthy"]

    def handler(request):
        if request.url.path == "/health":
            return httpx.Response(200 if request.url.port == 1 else 503)
        return httpx.Response(200, text='vllm:num_requests_waiting{engine="0"} 3.0\n'
                                        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n')

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            await probe_once(s, c)
    asyncio.run(go())
    snap = s.snapshot()
    assert snap[0]["healthy"] and snap[0]["waiting"] == 3 and snap[0]["kv_usage"] == 0.5
    assert not snap[1]["healthy"]           # 503 probe counts as a failure
    assert not snap[0]["host_tier"]


def test_a_replica_exporting_offload_series_is_seen_as_keeping_a_host_tier():
    s = state(policy="agent")
    tiered = {1}

    def handler(request):
        if request.url.path != "/metrics":
            return httpx.Response(200)
        text = 'vllm:kv_cache_usage_perc{engine="0"} 0.99\n'
        if request.url.port in tiered:
            text += 'vllm:kv_offload_total_bytes_total{engine="0",transfer_type="GPU_to_CPU"} 0.0\n'
        return httpx.Response(200, text=text)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            await probe_once(s, c)
    asyncio.run(go())
    assert [u["host_tier"] for u in s.snapshot()] == [True, False]
    assert [v.host_tier for v in s._views(list(s.upstreams.values()))] == [True, False]
    tiered.clear()                          # restarted without its tier
    asyncio.run(go())
    assert [u["host_tier"] for u in s.snapshot()] == [False, False]


def test_each_replicas_prefill_rate_is_measured_from_its_counters():
    s = state(policy="agent")
    totals = {1: [0.0, 0.0, 0.0], 2: [0.0, 0.0, 0.0]}     # prompt, cached, prefill seconds
    speed = {1: 40_000.0, 2: 10_000.0}

    def handler(request):
        if request.url.path != "/metrics":
            return httpx.Response(200)
        p, c, t = totals[request.url.port]
        return httpx.Response(200, text=(
            f'vllm:prompt_tokens_total{{engine="0"}} {p}\n'
            f'vllm:prompt_tokens_cached_total{{engine="0"}} {c}\n'
            f'vllm:request_prefill_time_seconds_sum{{engine="0"}} {t}\n'))

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            await probe_once(s, c)
    asyncio.run(go())
    assert [v.prefill_tokens_per_s for v in s._views(list(s.upstreams.values()))] == [0, 0]
    for port, tot in totals.items():         # 8,000 prompt tokens, 2,000 of them cached
        tot[0] += 8000
        tot[1] += 2000
        tot[2] += 6000 / speed[port]
    asyncio.run(go())
    rates = [v.prefill_tokens_per_s for v in s._views(list(s.upstreams.values()))]
    assert rates == pytest.approx([40_000.0, 10_000.0])
    totals[1] = [10.0, 0.0, 0.001]           # engine restarted: counters went back
    asyncio.run(go())
    assert s._views(list(s.upstreams.values()))[0].prefill_tokens_per_s == pytest.approx(40_000.0)


def test_membership_changes_keep_stable_ids():
    s = state(policy="agent")
    s.set_replicas(URLS[1:] + ["http://127.0.0.1:3"])
    assert [(u["id"], u["url"]) for u in s.snapshot()] == [(1, URLS[1]), (2, "http://127.0.0.1:3")]
    assert s.pick(ctx(session="x"))["replica"] in (1, 2)


def test_series_are_labelled_by_pod_and_a_removed_replicas_series_deleted():
    s = RoutingState(RouterConfig(replicas=[], discovery="kubernetes"))
    s.set_replicas(URLS, {URLS[0]: "llama-7f9-a", URLS[1]: "llama-7f9-b"})
    for i in range(2):
        d = s.pick(ctx(i))
        s.finish(ctx(i), d["replica"], "ok", {"prompt_tokens": 48}, 16)
    s.finish(ctx(9), 0, "retried")
    text = s.metrics_text().decode()
    assert 'replica="llama-7f9-a"' in text and 'replica="llama-7f9-b"' in text
    assert "127.0.0.1" not in text                      # no pod IP in any label
    s.set_replicas(URLS[1:], {URLS[1]: "llama-7f9-b"})   # pod a went away
    text = s.metrics_text().decode()
    assert 'replica="llama-7f9-a"' not in text, text
    assert 'anchorage_router_replica_healthy{replica="llama-7f9-b"} 1.0' in text
    # static replicas (no pod behind them) keep their URL as the label
    assert 'replica="http://127.0.0.1:1"' in state().metrics_text().decode()


def test_parse_vllm_gauges_ignores_other_series():
    assert parse_vllm_gauges("# HELP x\nvllm:num_requests_waiting 2\nvllm:other 9\n"
                             'vllm:kv_cache_usage_perc{a="b"} 0.1\n') == {"waiting": 2.0, "kv_usage": 0.1}


@pytest.mark.parametrize("kw, msg", [
    ({"replicas": []}, "at least one replica"),
    ({"replicas": ["10.0.0.1:8000"]}, "http://"),
    ({"policy": "nope"}, "unknown router"),
    ({"discovery": "dns"}, "discovery must be"),
])
def test_config_errors_are_clear(kw, msg):
    with pytest.raises(ValueError, match=msg):
        RouterConfig(**{"replicas": URLS, **kw}).validate()


def test_kv_events_reach_the_policy_in_router_keys():
    from anchorage.routing.keys import token_block_keys
    s = state(policy="precise_prefix", kv_events={URLS[1]: "ipc:///tmp/x"}, kv_events_port=5557)
    assert s.kv_endpoints() == {URLS[0]: "tcp://127.0.0.1:5557", URLS[1]: "ipc:///tmp/x"}
    prompt = list(range(64))
    s.queue_kv_events(URLS[1], [{"type": "BlockStored", "block_hashes": [b"a", b"b"],
                                 "parent_block_hash": None, "token_ids": prompt[:32],
                                 "block_size": 16}])
    c = RequestContext(request_id=1, keys=token_block_keys(prompt, 16), input_length=64)
    d = s.pick(c, tokens_per_key=16)
    assert d["replica"] == 1 and d["predicted_tokens"] == 32 and s.kv_events_applied == 1


def test_queued_tokens_follow_prompts_until_their_first_byte_and_steer_least_loaded():
    s = state(policy="least_loaded", policy_params={"choices": 2})
    big = RequestContext(request_id=1, keys=list(range(100)), input_length=16_000)
    d = s.pick(big)
    busy = d["replica"]
    assert s.snapshot()[busy]["queued_tokens"] == 16_000      # nothing predicted cached
    assert 'anchorage_router_replica_queued_tokens{replica="%s"} 16000.0' % d["url"] \
        in s.metrics_text().decode()
    # both replicas have one request in flight: the queued prompt decides
    other = s.pick(RequestContext(request_id=2, keys=[7], input_length=16))["replica"]
    assert other != busy
    assert s.pick(RequestContext(request_id=3, keys=[8], input_length=16))["replica"] == other
    s.first_byte(big, busy)                                  # prefill done
    assert s.snapshot()[busy]["queued_tokens"] == 0
    s.finish(big, busy, "ok")                                # idempotent for the estimate
    assert s.snapshot()[busy]["queued_tokens"] == 0
    views = {v.index: v for v in s._views(list(s.upstreams.values()))}
    assert views[busy].running == 0 and views[other].running == 2


def test_scraped_running_and_waiting_count_other_clients_requests():
    s = state(policy="least_loaded")

    def handler(request):
        if request.url.path == "/health":
            return httpx.Response(200)
        n = 5 if request.url.port == 1 else 0
        return httpx.Response(200, text=f'vllm:num_requests_running{{engine="0"}} {n}.0\n'
                                        f'vllm:num_requests_waiting{{engine="0"}} 2.0\n')

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            await probe_once(s, c)
    asyncio.run(go())
    v = s._views(list(s.upstreams.values()))
    assert (v[0].running, v[0].waiting) == (5, 2) and (v[1].running, v[1].waiting) == (0, 2)
    assert s.pick(ctx(9))["replica"] == 1


def test_readmission_forgets_the_replicas_prefix_model():
    s = state(policy="prefix", eject_after_failures=2)
    c = RequestContext(request_id=1, keys=[11, 12, 13], input_length=48)
    d = s.pick(c)
    s.finish(c, d["replica"], "ok")
    assert s.router.predicted_hit_blocks(c, d["replica"]) == 3
    up = s.upstreams[d["replica"]]
    s._failure(up)
    s._failure(up)
    assert not up.healthy
    s._success(up)                              # a good probe: back, with an empty cache
    assert up.healthy and s.router.predicted_hit_blocks(c, d["replica"]) == 0


def test_5xx_answers_do_not_eject_transport_failures_of_distinct_requests_do():
    s = state(policy="round_robin", eject_after_failures=2)
    for i in range(5):
        s.finish(ctx(i), 0, "server_error")
    assert s.snapshot()[0]["healthy"]
    s.finish(ctx(10), 0, "upstream_error")
    s.finish(ctx(11), 0, "ok")                  # an answer in between: the count restarts
    s.finish(ctx(12), 0, "timeout")
    assert s.snapshot()[0]["healthy"]
    s.finish(ctx(13), 0, "connect_error")
    assert not s.snapshot()[0]["healthy"]


def test_models_route_only_to_replicas_serving_them():
    s = state(policy="round_robin")
    a, b = s.upstreams[0], s.upstreams[1]
    s.set_models(a, [{"id": "llama"}])
    s.set_models(b, [{"id": "qwen"}])
    assert {s.pick(ctx(i), model="qwen")["replica"] for i in range(4)} == {1}
    assert s.pick(ctx(9), model="gpt") == {"status": "no_model"}
    assert [m["id"] for m in s.model_list()] == ["llama", "qwen"]


def test_a_models_own_policy_routes_it_and_labels_its_requests():
    """The operator's per-model document (``--config-dir``, as the chart mounts it) puts a
    model on its own policy: its requests are counted under that policy, the others under
    the command line's."""
    s = state(policy="round_robin")
    s.set_models(s.upstreams[0], [{"id": "llama"}])
    s.set_models(s.upstreams[1], [{"id": "llama"}])
    assert s.set_policy("llama", "session", {})
    assert s.router_for("llama") is not s.router and s.policy_for("llama") == "session"
    assert s.policy_for("qwen") == s.policy_for(None) == "round_robin"
    for i, model in ((1, "llama"), (2, None)):
        r = s.pick(ctx(i, session="a"), model=model)
        s.finish(ctx(i, session="a"), r["replica"], "ok", model=model)
    text = s.metrics_text().decode()
    assert text.count('requests_total{outcome="ok",policy="session"') == 1
    assert text.count('requests_total{outcome="ok",policy="round_robin"') == 1


def test_decisions_shared_between_router_processes_reach_the_policy():
    from anchorage.router.sync import DecisionLog, PeerSync

    log = DecisionLog()

    class Direct:                               # the actor's method, called in-process
        def __init__(self):
            self.exchange = type("M", (), {"remote": staticmethod(log.exchange)})()
    a, b = state(policy="agent"), state(policy="agent")
    sa, sb = PeerSync(a, Direct(), "a", 0.05), PeerSync(b, Direct(), "b", 0.05)
    # stamped on the clock the router's core uses (time.monotonic), as decoded peer decisions are
    c = RequestContext(request_id=1, keys=[1, 2, 3, 4, 5], input_length=80, session_id="s",
                       now_s=time.monotonic())
    home = a.pick(c)["replica"]
    asyncio.run(sa.exchange_once())
    asyncio.run(sb.exchange_once())
    assert sb.applied == 1
    assert b.snapshot()[home]["peer_inflight"] == 1         # a's request is in flight there
    again = RequestContext(request_id=2, keys=[1, 2, 3, 4, 5, 6], input_length=96,
                           session_id="s", now_s=time.monotonic())
    assert b.pick(again)["replica"] == home                  # b follows a's thread binding
    assert b.metrics_text().count(b"anchorage_router_peer_staleness_seconds_count 1.0") == 1
