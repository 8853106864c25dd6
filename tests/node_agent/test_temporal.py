"""The in-engine temporal controller's decisions (node_agent/temporal.py), the snapshot's
pending reloads (node_agent/state.py) and the sidecar's reload scheduling
(anchorage/warmup.py): pure, no engine."""

from __future__ import annotations

import math

import pytest
from anchorage.node_agent import tiering as engine_tiering
from anchorage.node_agent.state import (
    NodeState,
    PolicyStateExporter,
    SessionPrompts,
    StateError,
    parse_snapshot,
)
from anchorage.node_agent.temporal import (
    PoolReading,
    TemporalController,
    TemporalParams,
    kv_block_bytes,
    plan_offload,
)

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.warmup import ReloadConfig, ReloadScheduler, reload_body

MIB = 1 << 20
P = TemporalParams(host_bytes=1000 * MIB, link_gbs=25.0)
BUSY = PoolReading(capacity_blocks=100, free_blocks=30, block_bytes=2 * MIB)  # 70 % held


def ctx(rid, sid="s1", tool="search", now=0.0, warmup=False, keys=("k0", "k1")):
    return RequestContext(request_id=rid, keys=keys, input_length=64 * len(keys), now_s=now,
                          session_id=sid, tool_name=tool, warmup=warmup, agent_hint="coder",
                          tenant="t1")


# -- plan_offload (the gate on engine readings) --------------------------------------------


def test_long_stall_under_pressure_offloads_and_schedules_the_reload():
    inp, dec, at = plan_offload(10.0, 20, 20, 0, BUSY, P, end_s=100.0)
    assert dec.offload and dec.reason == "ok"
    assert inp.gpu_usage == pytest.approx(0.7)
    assert inp.host_free_blocks == 500
    transfer = P.latency_s + 20 * 2 * MIB / 25e9
    assert inp.offload_s == pytest.approx(transfer) and inp.reload_s == pytest.approx(transfer)
    # end + stall - reload - lead (10 % of the stall)
    assert at == pytest.approx(100.0 + 10.0 - transfer - 1.0)


def test_each_hard_rejection_on_engine_readings():
    assert plan_offload(0.001, 20, 20, 0, BUSY, P)[1].reason == "stall_short"
    idle = PoolReading(100, 90, 2 * MIB)
    assert plan_offload(10.0, 20, 20, 0, idle, P)[1].reason == "low_pressure"
    assert plan_offload(10.0, 20, 20, 490, BUSY, P)[1].reason == "host_full"
    assert plan_offload(10.0, 20, 20, 0, BUSY, P, since_move_s=1.0)[1].reason == "churn"
    no_fit = PoolReading(100, 30, 2 * MIB, waiting=[(500, 10)])
    assert plan_offload(10.0, 20, 20, 0, no_fit, P)[1].reason == "no_fit"


def test_unknown_queue_counts_as_fitting_and_a_known_queue_adds_pressure():
    inp, dec, _ = plan_offload(10.0, 20, 20, 0, BUSY, P)
    assert dec.fit_index == 0 and inp.waiting == ((1, 0),)
    q = PoolReading(100, 30, 2 * MIB, waiting=[(10, 320), (5, 160)])
    inp, dec, _ = plan_offload(10.0, 20, 20, 0, q, P)
    assert inp.gpu_usage == pytest.approx(0.85) and dec.offload


def test_unknown_block_bytes_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="bytes per KV block"):
        plan_offload(10.0, 20, 20, 0, PoolReading(100, 30, 0), P)


def test_params_from_env_name_the_variable():
    with pytest.raises(ValueError, match="ANCHORAGE_HOST_BYTES"):
        TemporalParams.from_env({})
    with pytest.raises(ValueError, match="ANCHORAGE_HOST_LINK_GBS must be a number"):
        TemporalParams.from_env({"ANCHORAGE_HOST_BYTES": "1e9", "ANCHORAGE_HOST_LINK_GBS": "x"})
    with pytest.raises(ValueError, match="WATERMARK"):
        TemporalParams.from_env({"ANCHORAGE_HOST_BYTES": "1e9",
                                 "ANCHORAGE_TEMPORAL_WATERMARK": "2"})
    p = TemporalParams.from_env({"ANCHORAGE_HOST_BYTES": "1e9", "ANCHORAGE_HOST_LINK_GBS": "50",
                                 "ANCHORAGE_TEMPORAL_WATERMARK": "0.25"})
    assert (p.host_bytes, p.link_gbs, p.gate.watermark) == (10**9, 50.0, 0.25)


def test_maybe_wrap_modes(monkeypatch):
    from anchorage.node_agent.temporal import TemporalTiering

    from anchorage.policies.registry import make_policy

    monkeypatch.setenv("ANCHORAGE_HOST_BYTES", "1000000")
    for mode, spatial in (("temporal", False), ("spatial,temporal", True)):
        monkeypatch.setenv("ANCHORAGE_TIERING", mode)
        p = engine_tiering.maybe_wrap(make_policy("lru", block_size=32))
        assert isinstance(p, TemporalTiering) and p.spatial is spatial
    monkeypatch.setenv("ANCHORAGE_TIERING", "temporal,bogus")
    with pytest.raises(ValueError, match="'spatial', 'temporal', 'spatial,temporal'"):
        engine_tiering.maybe_wrap(make_policy("lru", block_size=32))


def test_kv_block_bytes_from_the_cache_config():
    class T:
        def __init__(self, size):
            self.size = size

    class C:
        num_blocks = 10
        kv_cache_tensors = [T(10 * 4096), T(10 * 4096)]

    assert kv_block_bytes(C()) == 8192


# -- the controller over a session's life ---------------------------------------------------


def offload_once(c: TemporalController, end=0.0, stall_obs=None):
    if stall_obs is not None:  # teach the forecaster one stall of "search"
        c.turn_end(ctx("r0"), ["k0", "k1"], 2, BUSY, end - stall_obs - 1)
        c.request(ctx("r0b", tool=None), end - 1)
    return c.turn_end(ctx("r1"), ["k0", "k1"], 2, BUSY, end)


def test_a_returning_session_feeds_the_forecaster_and_warmups_do_not():
    c = TemporalController(P)
    offload_once(c, end=100.0, stall_obs=30.0)
    assert c.forecast.observed == 1 and c.forecast.predict("search") == pytest.approx(30.0)
    c.request(ctx("w1", warmup=True), 120.0)
    c.warmup_done(ctx("w1", warmup=True), 121.0)
    assert c.forecast.observed == 1
    c.request(ctx("r2", tool=None), 135.0, cached={"k1"})
    assert c.forecast.observed == 2
    assert c.reloads["in_time"] == 1


def test_reload_outcomes():
    c = TemporalController(P)
    assert offload_once(c, end=10.0, stall_obs=30.0).offload
    pend = c.pending()
    assert [s.sid for s in pend] == ["s1"] and pend[0].reload_at > 10.0
    # warm-up done, but the reloaded prefix left the cache before use: wasted
    c.request(ctx("w", warmup=True), 30.0)
    assert c.pending() == []
    h2d = c.bytes["h2d"]
    c.warmup_done(ctx("w", warmup=True), 31.0)
    assert c.bytes["h2d"] - h2d == 2 * 2 * MIB
    c.request(ctx("r2", tool=None), 40.0, cached=set())
    assert c.reloads["wasted"] == 1
    # the session came back before any warm-up: late (the request loads itself)
    assert c.turn_end(ctx("r3"), ["k0", "k1"], 2, BUSY, 50.0).offload
    c.request(ctx("r4", tool=None), 51.0, cached={"k1"})
    assert c.reloads["late"] == 2  # the teaching stall came back before any warm-up too
    assert c.host_used == 0
    assert c.bytes["d2h"] == 3 * 2 * 2 * MIB  # the teaching stall offloaded too


def test_churn_blocks_a_second_move_within_two_seconds():
    c = TemporalController(P)
    assert offload_once(c, end=10.0, stall_obs=30.0).offload
    c.request(ctx("r2", tool=None), 10.5)
    assert c.turn_end(ctx("r3"), ["k0", "k1"], 2, BUSY, 11.0).reason == "churn"
    assert c.offloads["churn"] == 1


def test_a_resumed_preempted_request_is_not_a_return():
    c = TemporalController(P)
    offload_once(c, end=10.0, stall_obs=30.0)
    n, outcomes = c.forecast.observed, dict(c.reloads)
    c.request(ctx("r1", tool="search"), 10.1)  # the same request id comes back
    assert c.forecast.observed == n and "s1" not in c.stalls and c.host_used == 0
    assert dict(c.reloads) == outcomes


def test_expired_stalls_release_host_room_and_count_wasted_reloads():
    c = TemporalController(dataclass_replace(P, horizon_s=60.0))
    offload_once(c, end=10.0, stall_obs=30.0)
    c.request(ctx("w", warmup=True), 30.0)
    c.warmup_done(ctx("w", warmup=True), 31.0)
    c.expire(100.0)
    assert c.stalls == {} and c.host_used == 0 and c.reloads["wasted"] == 1


def test_view_converts_reload_times_to_unix_time():
    c = TemporalController(P)
    offload_once(c, end=10.0, stall_obs=30.0)
    v = c.view(mono_now=12.0, unix_now=1000.0)
    (r,) = v["pending_reloads"]
    assert r["at_s"] == pytest.approx(1000.0 + c.stalls["s1"].reload_at - 12.0)
    assert r["session"] == "s1" and r["blocks"] == 2 and r["tenant"] == "t1"
    assert v["offloads"]["ok"] == 2 and set(v["reloads"]) == {"in_time", "late", "wasted"}


def dataclass_replace(p, **kw):
    import dataclasses

    return dataclasses.replace(p, **kw)


# -- the snapshot carries the session's prompt ----------------------------------------------


def test_session_prompts_are_bounded_in_tokens():
    sp = SessionPrompts(max_tokens=10)
    sp.offer("a", [1, 2, 3, 4], "salt-a")
    sp.offer("b", [5, 6, 7, 8], None)
    sp.offer("c", [9, 10, 11], None)  # 11 > 10: the oldest (a) goes
    assert sp.get("a") is None and sp.get("b") == ([5, 6, 7, 8], None)
    sp.offer("b", [1], None)  # an update replaces, and moves to the newest
    assert sp.total == 4
    sp.offer("d", list(range(11)), None)  # longer than the cap: not kept
    assert sp.get("d") is None


def test_snapshot_pending_reloads_carry_the_prompt_and_parse_back(tmp_path):
    st = NodeState(block_size=32)
    st.observe(EvictionPolicy(), ctx("r1"), [7] * 64, None, "salt-1")
    st.observe(EvictionPolicy(), ctx("w", sid="s2", warmup=True), [8] * 64, None, None)  # ignored
    pending = [{"id": "s1#1", "session": "s1", "at_s": 5.0, "blocks": 2, "agent": "coder",
                "tenant": "t1"},
               {"id": "s2#2", "session": "s2", "at_s": 6.0, "blocks": 2, "agent": None,
                "tenant": None}]
    view = {"policy": "lru", "tiering": {"mode": "temporal", "reserved_blocks": {},
                                         "offloads": {"ok": 1}, "pending_reloads": pending}}
    exp = PolicyStateExporter(lambda: view, tmp_path / "state.json", node_state=st)
    snap = parse_snapshot(exp.snapshot())
    (r,) = snap.tiering["pending_reloads"]  # s2's prompt is unknown: nothing to warm
    assert r["token_ids"] == [7] * 64 and r["cache_salt"] == "salt-1" and r["at_s"] == 5.0
    bad = exp.snapshot()
    bad["tiering"]["pending_reloads"][0]["token_ids"] = ["x"]
    with pytest.raises(StateError, match="token_ids must be a non-empty list of ints"):
        parse_snapshot(bad)


# -- the sidecar's reload scheduling ---------------------------------------------------------


def test_reload_scheduler_sends_each_due_reload_once_rate_limited():
    s = ReloadScheduler(ReloadConfig(rate_per_s=1.0, burst=2, max_late_s=30.0))
    pend = [{"id": f"s{i}#1", "at_s": 10.0 + i} for i in range(4)]
    assert s.due(9.0, pend) == []
    assert [r["id"] for r in s.due(13.0, pend)] == ["s0#1", "s1#1"]  # burst 2
    assert s.rate_limited == 1
    assert [r["id"] for r in s.due(14.0, pend)] == ["s2#1"]
    assert [r["id"] for r in s.due(15.0, pend)] == ["s3#1"]
    assert s.due(100.0, pend) == []  # each once
    late = [{"id": "x#1", "at_s": 0.0}]
    assert s.due(100.0, late) == [] and s.expired == 1


def test_reload_body_is_a_warmup_under_the_session_and_salt():
    b = reload_body("m", {"token_ids": [1, 2], "session": "s1", "cache_salt": "salt",
                          "agent": "coder", "tenant": "t1"})
    assert b == {"model": "m", "prompt": [1, 2], "max_tokens": 1, "session_id": "s1",
                 "cache_salt": "salt",
                 "vllm_xargs": {"anchorage.warmup": 1, "anchorage.agent": "coder",
                                "anchorage.tenant": "t1"}}
    assert "cache_salt" not in reload_body("m", {"token_ids": [1], "session": "s"})
    assert math.isfinite(P.transfer_s(1, MIB))


# -- the scheduler's queue, when the prefix-aware scheduler shows it ------------------------


def fake_vllm_pool(**extra):
    from types import SimpleNamespace

    q = SimpleNamespace(num_free_blocks=7)
    return SimpleNamespace(num_gpu_blocks=11, hash_block_size=32, blocks=[],
                           cached_block_hash_to_block=None, free_block_queue=q, **extra)


def test_pool_view_reads_the_queue_only_when_the_scheduler_shows_it():
    from anchorage.node_agent.vllm_block_pool import PoolView

    assert PoolView(fake_vllm_pool()).waiting_demand() is None  # stock scheduler: unknown
    v = PoolView(fake_vllm_pool(_anchorage_waiting_demand=lambda: [(3, 100), (0, 40)]))
    assert v.waiting_demand() == [(3, 100), (0, 40)] and v.num_free_blocks == 7


def test_prefix_aware_scheduler_reports_new_blocks_of_the_first_waiting_requests():
    from types import SimpleNamespace

    from anchorage.node_agent.scheduler import PrefixAwareMixin

    reqs = [SimpleNamespace(request_id=f"r{i}", num_tokens=64 * (i + 1)) for i in range(40)]
    me = SimpleNamespace(
        _anchorage_pool=SimpleNamespace(
            cached_block_hash_to_block=SimpleNamespace(get_one_block=lambda k: None)),
        waiting=reqs, _anchorage_new_blocks=lambda r: 2 * int(r.request_id[1:]) - 1)
    out = PrefixAwareMixin._anchorage_waiting_demand(me)
    assert len(out) == 32  # the first 32, in queue order
    assert out[:3] == [(0, 64), (1, 128), (3, 192)]


# -- what a stall gets: offload / hold / backup / keep (anchorage.tiering.temporal) ---------


def test_plan_stall_maps_each_gate_outcome_to_its_action():
    from anchorage.node_agent.temporal import plan_stall, survival_s

    _, ok, _ = plan_offload(10.0, 20, 20, 0, BUSY, P)
    assert plan_stall(ok, 10.0, 100.0, 5.0) == ("offload", None)
    _, short, _ = plan_offload(0.001, 20, 20, 0, BUSY, P)
    act, until = plan_stall(short, 0.001, 100.0, 5.0)
    assert act == "hold" and until == pytest.approx(100.0 + 0.001 + 0.05)  # min hold 50 ms
    act, until = plan_stall(dataclass_replace(short, window_s=-1.0), 4.0, 100.0, 5.0)
    assert until == pytest.approx(100.0 + 4.0 + 2.0)  # half the stall
    _, low, _ = plan_offload(10.0, 20, 20, 0, PoolReading(100, 90, 2 * MIB), P)
    assert plan_stall(low, 10.0, 0.0, 5.0) == ("backup", None)
    assert plan_stall(low, 10.0, 0.0, math.inf) == ("keep", None)  # no turnover yet
    _, full, _ = plan_offload(10.0, 20, 20, 490, BUSY, P)
    assert plan_stall(full, 10.0, 0.0, 5.0) == ("keep", None)
    assert survival_s(math.inf, 30, 100) == math.inf
    assert survival_s(20.0, 30, 100) == pytest.approx(6.0)


def test_rejected_stalls_count_their_action_next_to_the_reason():
    c = TemporalController(P)
    c.turn_end(ctx("r0"), ["k0", "k1"], 2, BUSY, 0.0)
    c.request(ctx("r0b", tool=None), 0.0)  # a stall of 0 s: the next one is short
    assert c.turn_end(ctx("r1"), ["k0", "k1"], 2, BUSY, 10.0).reason == "stall_short"
    st = c.stalls["s1"]
    assert st.action == "hold" and st.hold_until == pytest.approx(10.05)
    assert c.offloads["stall_short"] == 1 and c.offloads["hold"] == 1
    c.request(ctx("r1b", tool=None), 10.0)
    idle = PoolReading(100, 90, 2 * MIB)
    c.turn_end(ctx("r2", tool="grep"), ["k0", "k1"], 2, idle, 20.0)  # low pressure
    assert c.offloads["low_pressure"] == 1 and c.offloads["keep"] == 1  # no turnover yet
    clock = iter([20.0, 30.0]).__next__
    for _ in range(100 + 1):  # the cache turns over once in 10 s
        c.evicted(100, clock)
    assert c.turnover_s == pytest.approx(10.0)
    c.request(ctx("r2b", tool=None), 21.0)
    c.turn_end(ctx("r3", tool="grep"), ["k0", "k1"], 2, idle, 30.0)
    assert c.stalls["s1"].action == "backup" and c.offloads["backup"] == 1
    assert sum(c.offloads[r] for r in ("ok", "stall_short", "low_pressure")) == 4  # stalls


def test_the_admission_wait_lengthens_the_predicted_stall():
    def short_then(c):
        c.turn_end(ctx("r0"), ["k0", "k1"], 2, BUSY, 0.0)
        c.request(ctx("r0b", tool=None), 0.0)  # "search" stalls 0 s
        return c.turn_end(ctx("r1"), ["k0", "k1"], 2, BUSY, 10.0)

    c = TemporalController(P)
    for _ in range(3):
        c.admitted(10.0)
    assert c.wait_s == pytest.approx(10.0 * (1 - 0.8 ** 3)) and c.admissions == 3
    assert c.predicted_stall("search", None) == pytest.approx(1.0 + c.wait_s)  # default 1 s
    d = short_then(c)  # 0 s of tool + 4.9 s of queue: the blocks would wait, offload
    assert d.offload and c.stalls["s1"].action == "offload"
    off = TemporalController(dataclass_replace(P, queue_wait=False))
    off.admitted(10.0)
    assert short_then(off).reason == "stall_short"
    with pytest.raises(ValueError, match="wait_ewma"):
        dataclass_replace(P, wait_ewma=0.0)
