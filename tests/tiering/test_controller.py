"""The temporal controller (anchorage/tiering/controller.py) over typed readings: pure, no
engine, no simulator."""

from __future__ import annotations

import dataclasses
import math

import pytest

from anchorage.tiering.controller import (
    UNKNOWN_QUEUE,
    PoolReading,
    SessionReading,
    TemporalController,
    gate_input,
    pressure,
)
from anchorage.tiering.host_tier import HostTierConfig
from anchorage.tiering.params import UNBOUNDED, TemporalParams, TieringConfig
from anchorage.tiering.temporal import GateParams

MIB = 1 << 20
P = TemporalParams(host=HostTierConfig(capacity_bytes=1000 * MIB))  # 500 blocks of 2 MiB
# 100 blocks, 30 free of which 20 cached: 70 % held, 10 free without eviction
BUSY = PoolReading(capacity_blocks=100, free_blocks=30, cached_free_blocks=20,
                   block_bytes=2 * MIB)
S20 = SessionReading(gpu_blocks=20, copy_blocks=20)
LINK = P.host.latency_s + 20 * 2 * MIB / 25e9  # 20 blocks over 25 GB/s


def keys(n: int, prefix: str = "k") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def ctl(params: TemporalParams = P, **kw) -> TemporalController:
    return TemporalController(params, 100, **kw)


def teach(c: TemporalController, sid: str, tool: str, gap_s: float, at: float = 0.0) -> None:
    c.turn_end(sid, at, tool)
    c.returned(sid, at + gap_s)


# -- the readings ---------------------------------------------------------------------------


def test_free_block_semantics_uncached_room_cached_survival_all_free_for_pressure():
    assert BUSY.uncached_free_blocks == 10
    assert BUSY.pressure == pytest.approx(0.7)  # every free block counts as free
    inp = gate_input(10.0, S20, BUSY, P, host_used_blocks=0)
    assert inp.free_blocks == 10 and inp.freed_blocks == 20
    # the fit test counts what a request takes without evicting: 10 uncached + 20 freed
    room = PoolReading(100, 30, 20, 2 * MIB, waiting=[(30, 10)])
    assert gate_input(10.0, S20, room, P, 0).free_blocks + 20 == 30
    c = ctl(P)
    assert c.plan(c.turn_end("s", 0.0, "t"), S20, room).offload
    tight = PoolReading(100, 30, 21, 2 * MIB, waiting=[(30, 10)])  # one more cached
    assert c.plan(c.turn_end("s2", 0.0, "t"), S20, tight).reason == "no_fit"
    # survival counts the cached free blocks ahead of a freed block
    c.observe_evictions(0, 0.0)
    c.observe_evictions(100, 10.0)  # one turnover in 10 s
    assert c.survival_s(BUSY.cached_free_blocks) == pytest.approx(10.0 * 20 / 100)
    assert c.survival_s(0) == 0.0


def test_gate_input_from_readings():
    inp = gate_input(10.0, SessionReading(20, 5, recompute_s=3.0),
                     dataclasses.replace(BUSY, waiting=[(10, 320), (5, 160)],
                                         tokens_per_s=1e4, d2h_wait_s=0.25),
                     P, host_used_blocks=40, since_move_s=7.0, criticality=0.5)
    h = P.host
    assert inp.offload_s == pytest.approx(0.25 + h.latency_s + 5 * 2 * MIB / 25e9)
    assert inp.reload_s == pytest.approx(LINK)
    assert inp.gpu_usage == pytest.approx(min(1.0, (70 + 15) / 100))
    assert inp.host_free_blocks == 500 - 40 and inp.offload_blocks == 5
    assert (inp.tokens_per_s, inp.since_move_s, inp.criticality, inp.recompute_s) == (
        1e4, 7.0, 0.5, 3.0)
    assert gate_input(10.0, S20, BUSY, P, 0).waiting == UNKNOWN_QUEUE
    assert pressure(100, 30, None) == pytest.approx(0.7)
    assert pressure(100, 0, [(50, 0)]) == 1.0  # capped


def test_unknown_block_bytes_is_an_error_not_a_guess():
    c = ctl()
    with pytest.raises(ValueError, match="bytes per KV block"):
        c.plan(c.turn_end("s", 0.0, "t"), S20, dataclasses.replace(BUSY, block_bytes=0))


# -- the plan -------------------------------------------------------------------------------


def test_a_long_stall_under_pressure_offloads_and_schedules_the_reload():
    c = ctl()
    teach(c, "s", "search", 10.0)
    st = c.turn_end("s", 100.0, "search", agent="coder", tenant="t1")
    dec = c.plan(st, S20, BUSY)
    assert dec.offload and st.action == "offload" and st.reason == "ok"
    assert st.idle_s == pytest.approx(10.0) and st.reuse_s == pytest.approx(110.0)
    assert st.offload_s == pytest.approx(LINK) and st.reload_s == pytest.approx(LINK)
    assert st.reload_at is None  # not before the adapter copied
    c.offloaded(st, 100.0, 100.0 + st.offload_s, keys(20))
    # end + stall - reload - lead (10 % of the stall)
    assert st.reload_at == pytest.approx(100.0 + 10.0 - LINK - 1.0)
    assert c.gate["ok"] == 1 and c.actions["offload"] == 1
    # never before the copy completes
    st2 = c.turn_end("s2", 100.0, "search")
    c.plan(st2, S20, BUSY)
    c.offloaded(st2, 100.0, 200.0, keys(20, "x"))
    assert st2.reload_at == 200.0


def test_each_rejection_and_its_action():
    c = ctl()
    teach(c, "s", "search", 10.0)
    c.observe_evictions(0, 0.0)
    c.observe_evictions(100, 10.0)  # the cache turned over: backups happen

    def plan(reading=BUSY, session=S20, tool="search", sid="s", host_used=0):
        st = c.turn_end(sid, 50.0, tool)
        c.pins.clear()
        c.pins.update({f"h{i}": 1 for i in range(host_used)})
        c.plan(st, session, reading)
        return st.reason, st.action

    assert plan(tool="grep") == ("ok", "offload")  # default stall 1 s
    teach(c, "q", "quick", 0.0)
    assert plan(tool="quick") == ("stall_short", "hold")
    assert plan(PoolReading(100, 90, 20, 2 * MIB)) == ("low_pressure", "backup")
    assert plan(host_used=490) == ("host_full", "keep")
    assert plan(dataclasses.replace(BUSY, waiting=[(500, 10)])) == ("no_fit", "backup")
    assert plan(session=SessionReading(20, 20, recompute_s=0.0)) == ("low_saving", "keep")
    c.moved("s", 49.0)
    assert plan() == ("churn", "backup")
    assert sum(c.gate.values()) == sum(c.actions.values()) == 7


def test_a_short_stall_is_held_until_the_predicted_return_plus_a_margin():
    c = ctl()
    teach(c, "s", "read", 0.0)
    st = c.turn_end("s", 10.0, "read")
    c.plan(st, S20, BUSY)
    assert st.action == "hold" and st.hold_until == pytest.approx(10.0 + 0.05)
    c2 = ctl(dataclasses.replace(P, gate=GateParams(churn_s=0.0)))
    teach(c2, "s", "read", 0.002)
    st = c2.turn_end("s", 10.0, "read")
    c2.plan(st, SessionReading(20, 20), dataclasses.replace(BUSY, d2h_wait_s=10.0))
    assert st.reason == "stall_short"
    assert st.hold_until == pytest.approx(10.0 + 0.002 + 0.05)


def test_backups_wait_for_the_first_turnover():
    c = ctl()
    idle = PoolReading(100, 90, 80, 2 * MIB)
    st = c.turn_end("s", 0.0, "t")
    c.plan(st, S20, idle)
    assert (st.reason, st.action) == ("low_pressure", "keep")  # survival inf: no eviction


def test_the_admission_wait_lengthens_the_predicted_stall():
    c = ctl()
    teach(c, "s", "search", 0.0)
    for _ in range(3):
        c.admitted(10.0)
    assert c.wait_s == pytest.approx(10.0 * (1 - 0.8 ** 3)) and c.admissions == 3
    st = c.turn_end("s", 10.0, "search")
    assert c.plan(st, S20, BUSY).offload  # 0 s of tool + 4.9 s of queue
    off = ctl(dataclasses.replace(P, queue_wait=False))
    teach(off, "s", "search", 0.0)
    off.admitted(10.0)
    assert off.plan(off.turn_end("s", 10.0, "search"), S20, BUSY).reason == "stall_short"


# -- stalls ---------------------------------------------------------------------------------


class Recorder(TemporalController):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.why: list[tuple[str, str]] = []

    def dropped(self, st, why):
        self.why.append((st.sid, why))


def offload(c: TemporalController, sid: str, ks: list[str], end: float = 0.0):
    st = c.turn_end(sid, end, "search")
    c.plan(st, SessionReading(len(ks), len(ks)), BUSY)
    c.offloaded(st, end, end, ks)
    return st


def test_host_occupancy_counts_a_shared_prefix_once_and_is_released():
    c = Recorder(P, 100)
    offload(c, "a", keys(10))
    offload(c, "b", keys(10) + keys(5, "b"))
    assert c.host_used_blocks == 15  # the 10 shared keys once
    inp = gate_input(10.0, S20, BUSY, P, c.host_used_blocks)
    assert inp.host_free_blocks == 500 - 15
    c.returned("a", 5.0)
    assert c.host_used_blocks == 15  # b still holds them
    c.returned("b", 5.0)
    assert c.host_used_blocks == 0 and not c.pins
    assert c.why == [] and c.forecast.observed == 2


def test_dropped_stalls_release_host_room_and_say_why():
    c = Recorder(dataclasses.replace(P, horizon_s=60.0, max_sessions=2), 100)
    offload(c, "a", keys(3, "a"))
    offload(c, "a", keys(3, "a"), end=1.0)  # the same session again, never back
    offload(c, "b", keys(3, "b"), end=2.0)
    offload(c, "c", keys(3, "c"), end=3.0)  # a third open stall: the oldest goes
    assert c.why == [("a", "replaced"), ("a", "bounded")]
    assert list(c.stalls) == ["b", "c"] and c.host_used_blocks == 6
    c.expire(62.5)
    assert c.why[-1] == ("b", "expired") and list(c.stalls) == ["c"]
    c.turn_end("d", 100.0, "t")  # a turn end expires what is older than the horizon
    assert list(c.stalls) == ["d"] and c.host_used_blocks == 0
    assert c.forecast.observed == 0  # none of them came back


def test_a_resumed_request_closes_the_stall_without_learning():
    c = ctl()
    offload(c, "s", keys(4))
    st = c.returned("s", 3.0, learn=False)
    assert st is not None and c.forecast.observed == 0 and c.host_used_blocks == 0
    assert c.returned("s", 4.0) is None  # already closed


def test_a_reload_is_a_move_for_the_churn_test():
    c = ctl()
    teach(c, "s", "search", 10.0)
    c.moved("s", 99.0)  # e.g. a warm-up reload just before the turn ended
    st = c.turn_end("s", 100.0, "search")
    assert c.plan(st, S20, BUSY).reason == "churn"
    c.turn_end("s", 102.0, "search")
    assert c.plan(c.stalls["s"], S20, BUSY).offload  # 3 s later: moves again


def test_turnover_starts_at_the_first_eviction_or_at_a_given_clock():
    c = ctl()  # the engine's: the first eviction starts the clock and counts
    c.observe_evictions(1, 5.0)
    assert c.turnover_s == math.inf
    c.observe_evictions(100, 15.0)
    assert c.turnover_s == pytest.approx(10.0)
    s = ctl(turnover_start_s=0.0)  # the simulator's: the clock starts at 0
    s.observe_evictions(100, 15.0)
    assert s.turnover_s == pytest.approx(15.0)
    s.attach(10)
    assert s.turnover_s == math.inf and s.turnover.capacity == 10


def test_the_reload_test_charges_the_host_to_device_link():
    c = ctl(dataclasses.replace(P, gate=GateParams(min_saving_ratio=2.0)))
    link = P.host.h2d_s(20 * 2 * MIB)
    assert c.reload_worth(2 * link, 20, 2 * MIB)
    assert not c.reload_worth(1.99 * link, 20, 2 * MIB)


# -- parameters -----------------------------------------------------------------------------


def test_params_reject_unknown_names_and_bad_values():
    with pytest.raises(TypeError, match="link_gbs"):
        TemporalParams(link_gbs=25.0)
    with pytest.raises(TypeError, match="bogus"):
        TieringConfig(bogus=1)
    with pytest.raises(ValueError, match="horizon_s"):
        TemporalParams(horizon_s=0.0)
    with pytest.raises(ValueError, match="max_sessions"):
        TemporalParams(max_sessions=0)
    with pytest.raises(ValueError, match="wait_ewma"):
        TieringConfig(wait_ewma=2.0)


def test_the_simulator_config_is_the_controllers_params_unbounded():
    t = TieringConfig(gate=GateParams(watermark=0.3), queue_wait=False)
    assert isinstance(t, TemporalParams)
    assert (t.horizon_s, t.max_sessions) == (math.inf, UNBOUNDED)
    assert t.gate.watermark == 0.3 and t.max_waiting_scan == 32
    assert (P.horizon_s, P.max_sessions) == (600.0, 4096)


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
    assert (p.host.capacity_bytes, p.host.d2h_bytes_s, p.host.h2d_bytes_s) == (
        10**9, 50e9, 50e9)
    assert p.gate.watermark == 0.25
