"""The engine's side of the temporal controller (node_agent/temporal.py: warm-ups, reload
outcomes, counters; the decisions are tests/tiering/test_controller.py's), the snapshot's
pending reloads (node_agent/state.py) and the sidecar's reload scheduling
(anchorage/warmup.py): pure, no engine."""

from __future__ import annotations

import dataclasses
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
from anchorage.node_agent.temporal import EngineController, TemporalParams

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.tiering.controller import PoolReading
from anchorage.tiering.host_tier import HostTierConfig
from anchorage.warmup import ReloadConfig, ReloadScheduler, reload_body

MIB = 1 << 20
P = TemporalParams(host=HostTierConfig(capacity_bytes=1000 * MIB))
BUSY = PoolReading(capacity_blocks=100, free_blocks=30, cached_free_blocks=30,
                   block_bytes=2 * MIB)  # 70 % held


def ctx(rid, sid="s1", tool="search", now=0.0, warmup=False, keys=("k0", "k1")):
    return RequestContext(request_id=rid, keys=keys, input_length=64 * len(keys), now_s=now,
                          session_id=sid, tool_name=tool, warmup=warmup, agent_hint="coder",
                          tenant="t1")


def turn_end(c: EngineController, rid, now, reading=BUSY, tool="search", keys=("k0", "k1")):
    return c.stall(ctx(rid, tool=tool, keys=keys, now=now), list(keys), reading)


def test_params_from_env_reach_the_engine():
    p = TemporalParams.from_env({"ANCHORAGE_HOST_BYTES": "1e9", "ANCHORAGE_HOST_LINK_GBS": "50",
                                 "ANCHORAGE_TEMPORAL_WATERMARK": "0.25"})
    assert (p.host.capacity_bytes, p.host.h2d_bytes_s, p.gate.watermark) == (10**9, 50e9, 0.25)
    assert p.horizon_s == 600.0 and p.max_sessions == 4096  # the engine's bounds


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


# -- the controller over a session's life ---------------------------------------------------


def offload_once(c: EngineController, end=0.0, stall_obs=None):
    if stall_obs is not None:  # teach the forecaster one stall of "search"
        turn_end(c, "r0", end - stall_obs - 1)
        c.request(ctx("r0b", tool=None), end - 1)
    return turn_end(c, "r1", end)


def test_a_returning_session_feeds_the_forecaster_and_warmups_do_not():
    c = EngineController(P)
    offload_once(c, end=100.0, stall_obs=30.0)
    assert c.forecast.observed == 1 and c.forecast.predict("search") == pytest.approx(30.0)
    c.request(ctx("w1", warmup=True), 120.0)
    c.warmup_done(ctx("w1", warmup=True), 121.0)
    assert c.forecast.observed == 1
    c.request(ctx("r2", tool=None), 135.0, cached={"k1"})
    assert c.forecast.observed == 2
    assert c.reloads["in_time"] == 1


def test_reload_outcomes():
    c = EngineController(P)
    assert offload_once(c, end=10.0, stall_obs=30.0).offloaded
    pend = c.pending()
    assert [s.sid for s in pend] == ["s1"] and pend[0].reload_at > 10.0
    # warm-up done, but the reloaded prefix left the cache before use: wasted
    c.request(ctx("w", warmup=True), 30.0)
    assert c.pending() == []
    assert c.last_move["s1"] == 30.0  # a reload is a move (churn)
    h2d = c.bytes["h2d"]
    c.warmup_done(ctx("w", warmup=True), 31.0)
    assert c.bytes["h2d"] - h2d == 2 * 2 * MIB
    c.request(ctx("r2", tool=None), 40.0, cached=set())
    assert c.reloads["wasted"] == 1
    # the session came back before any warm-up: late (the request loads itself)
    assert turn_end(c, "r3", 50.0).offloaded
    c.request(ctx("r4", tool=None), 51.0, cached={"k1"})
    assert c.reloads["late"] == 2  # the teaching stall came back before any warm-up too
    assert c.host_used_blocks == 0
    assert c.bytes["d2h"] == 3 * 2 * 2 * MIB  # the teaching stall offloaded too


def test_a_stall_without_cached_blocks_is_not_gated_but_still_learns():
    c = EngineController(P)
    st = turn_end(c, "r1", 10.0, keys=())
    assert st.reason is None and not c.gate and not c.actions and "s1" in c.stalls
    c.request(ctx("r2", tool=None), 15.0)
    assert c.forecast.observed == 1 and c.forecast.predict("search") == pytest.approx(5.0)


def test_churn_blocks_a_second_move_within_two_seconds():
    c = EngineController(P)
    assert offload_once(c, end=10.0, stall_obs=30.0).offloaded
    c.request(ctx("r2", tool=None), 10.5)
    assert turn_end(c, "r3", 11.0).reason == "churn"
    assert c.offloads["churn"] == 1 and c.offloads["backup"] + c.offloads["keep"] == 1


def test_a_resumed_preempted_request_is_not_a_return():
    c = EngineController(P)
    offload_once(c, end=10.0, stall_obs=30.0)
    n, outcomes = c.forecast.observed, dict(c.reloads)
    c.request(ctx("r1", tool="search"), 10.1)  # the same request id comes back
    assert c.forecast.observed == n and "s1" not in c.stalls and c.host_used_blocks == 0
    assert dict(c.reloads) == outcomes


def test_expired_stalls_release_host_room_and_count_wasted_reloads():
    c = EngineController(dataclasses.replace(P, horizon_s=60.0))
    offload_once(c, end=10.0, stall_obs=30.0)
    c.request(ctx("w", warmup=True), 30.0)
    c.warmup_done(ctx("w", warmup=True), 31.0)
    c.expire(100.0)
    assert c.stalls == {} and c.host_used_blocks == 0 and c.reloads["wasted"] == 1


def test_a_stall_dropped_for_room_counts_a_finished_warmup_as_wasted():
    c = EngineController(dataclasses.replace(P, max_sessions=1))
    offload_once(c, end=10.0)
    c.request(ctx("w", warmup=True), 12.0)
    c.warmup_done(ctx("w", warmup=True), 13.0)
    x = ctx("o1", sid="other")
    c.turn_end("other", 14.0, x.tool_name, rid="o1")  # the only slot: s1's stall goes
    assert list(c.stalls) == ["other"] and c.reloads["wasted"] == 1


def test_view_converts_reload_times_to_unix_time():
    c = EngineController(P)
    offload_once(c, end=10.0, stall_obs=30.0)
    v = c.view(mono_now=12.0, unix_now=1000.0)
    (r,) = v["pending_reloads"]
    assert r["at_s"] == pytest.approx(1000.0 + c.stalls["s1"].reload_at - 12.0)
    assert r["session"] == "s1" and r["blocks"] == 2 and r["tenant"] == "t1"
    assert v["offloads"]["ok"] == 2 and set(v["reloads"]) == {"in_time", "late", "wasted"}
    assert "offload" not in v["offloads"]  # accepted stalls count once, by reason


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
    assert math.isfinite(P.host.h2d_s(MIB))


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
