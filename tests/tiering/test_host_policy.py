"""The host-tier policy of the core (``anchorage.tiering.host_policy``) over the session
predictions (``anchorage.tiering.returns``), and the simulator's model of vLLM's CPU
manager (``anchorage.tiering.offload_model``): pure tests, no engine."""

from __future__ import annotations

import math

import pytest

from anchorage.tiering.host_policy import HostPolicy
from anchorage.tiering.offload_model import Chunk, HostStore
from anchorage.tiering.params import TemporalParams
from anchorage.tiering.returns import NO_TOOL, SessionReturns


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def ready(i: int) -> Chunk:
    c = Chunk(i)
    c.ref_cnt = 0
    return c


def store(pol: HostPolicy, keys, rid) -> None:
    for k in keys:
        pol.insert(k, ready(hash(k) & 0xFFFF), rid)


def teach(ret: SessionReturns, clock: Clock, tool: str, gap_s: float, n: int = 20) -> None:
    """``n`` sessions whose turns end with ``tool`` and come back ``gap_s`` later."""
    for i in range(n):
        sid = f"teach-{tool}-{i}"
        ret.request(("t", sid, 0), sid, clock.t, tool=tool)
        ret.finished(("t", sid, 0), clock.t)
        clock.t += gap_s
        ret.request(("t", sid, 1), sid, clock.t)
        ret.finished(("t", sid, 1), clock.t)


def test_without_predictions_the_order_is_recency():
    clock = Clock()
    pol = HostPolicy(8, clock=clock)
    for k in "abcd":
        clock.t += 1
        pol.insert(k, ready(ord(k)))
    clock.t += 1
    pol.touch(["a"])
    assert [k for k, _ in pol.evict(3, set())] == ["b", "c", "d"]
    assert pol.evict(2, set()) is None, "one key left: two cannot be evicted"
    assert list(pol.chunks) == ["a"], "a failed eviction changes nothing"


def test_a_session_expected_back_soon_outlives_a_more_recent_one_expected_late():
    """The held-out case for LRU: the session that stalled first (on a fast tool) comes
    back first; the one that stalled last (on a slow tool) is the better victim."""
    clock = Clock()
    ret = SessionReturns(TemporalParams())
    teach(ret, clock, "fast", 2.0)
    teach(ret, clock, "slow", 120.0)
    pol = HostPolicy(64, ret, clock=clock)
    lru = HostPolicy(64, clock=clock)
    for sid, tool in (("A", "fast"), ("B", "slow")):
        ret.request((sid, 0), sid, clock.t, tool=tool)
        for p in (pol, lru):
            store(p, [f"{sid}{i}" for i in range(4)], (sid, 0))
        ret.finished((sid, 0), clock.t)
        clock.t += 0.5
    assert ret.next_use_s("A", clock.t) < ret.next_use_s("B", clock.t)
    assert {k[0] for k, _ in pol.evict(4, set())} == {"B"}
    assert {k[0] for k, _ in lru.evict(4, set())} == {"A"}


def test_active_sessions_are_kept_and_ended_ones_go_first():
    clock = Clock()
    ret = SessionReturns(TemporalParams(), end_factor=2.0, min_gaps=16)
    teach(ret, clock, "t", 1.0, n=30)
    pol = HostPolicy(64, ret, clock=clock)
    ret.request(("old", 0), "old", clock.t, tool="t")
    store(pol, ["o1", "o2"], ("old", 0))
    ret.finished(("old", 0), clock.t)
    clock.t += 100.0  # far past 2 x the 99th percentile of 1 s gaps: the session ended
    ret.request(("run", 0), "run", clock.t)
    store(pol, ["r1", "r2"], ("run", 0))  # in flight
    ret.request(("idle", 0), "idle", clock.t, tool="t")
    store(pol, ["i1", "i2"], ("idle", 0))
    ret.finished(("idle", 0), clock.t)
    assert ret.next_use_s("old", clock.t) == math.inf and ret.ends == 1
    assert ret.next_use_s("run", clock.t) == clock.t
    order = [k for k, _ in pol.evict(4, set())]
    assert set(order[:2]) == {"o1", "o2"} and set(order[2:]) == {"i1", "i2"}
    ret.request(("old", 1), "old", clock.t)  # it came back after all: the end is retracted
    assert ret.ctl.forecast.gaps.histogram("t").ends == 0


def test_pinned_keys_go_last_and_protected_keys_are_skipped():
    clock = Clock()
    ret = SessionReturns(TemporalParams())
    pol = HostPolicy(16, ret, clock=clock)
    for sid in ("P", "Q"):
        ret.request((sid, 0), sid, clock.t, tool="x")
        store(pol, [f"{sid}1", f"{sid}2"], (sid, 0))
        ret.finished((sid, 0), clock.t)
        clock.t += 1
    st = ret.ctl.stalls["Q"]
    ret.ctl.offloaded(st, clock.t, clock.t, ["Q1", "Q2"])  # Q's copy is pinned
    first, second = (k for k, _ in pol.evict(2, {"P1"}))
    assert first == "P2" and second in ("Q1", "Q2")


def test_a_prefix_every_session_uses_outlives_single_use_history():
    clock = Clock()
    ret = SessionReturns(TemporalParams())
    pol = HostPolicy(64, ret, clock=clock)
    lru = HostPolicy(64, clock=clock)
    for i in range(6):
        sid = f"s{i}"
        ret.request((sid, 0), sid, clock.t)
        for p in (pol, lru):
            if i == 0:
                store(p, ["anchor"], (sid, 0))
            else:
                p.touch(["anchor"], (sid, 0))
            store(p, [f"h{i}"], (sid, 0))
        ret.finished((sid, 0), clock.t)
        clock.t += 1.0
    clock.t += 3.0
    order = [k for k, _ in pol.evict(6, set())]
    assert sorted(order) == [f"h{i}" for i in range(6)] and list(pol.chunks) == ["anchor"]
    lru.evict(6, set())
    assert list(lru.chunks) == ["h5"], "LRU drops the prefix the last session touched first"


def test_the_oracle_knows_the_true_return():
    clock = Clock()
    ret = SessionReturns(TemporalParams(), oracle=True)
    ret.request(("a", 0), "a", 0.0, tool="x")
    ret.finished(("a", 0), 1.0, next_gap_s=5.0)
    ret.request(("b", 0), "b", 0.0)
    ret.finished(("b", 0), 1.0, next_gap_s=None)  # its last turn
    assert ret.next_use_s("a", 2.0) == 6.0 and ret.next_use_s("b", 2.0) == math.inf


def test_gaps_after_a_turn_without_a_tool_have_their_own_context():
    ret = SessionReturns(TemporalParams())
    for i in range(20):
        ret.request(("u", i), "u", 10.0 * i)
        ret.finished(("u", i), 10.0 * i + 1)
    h = ret.ctl.forecast.gaps.histogram(NO_TOOL)
    assert h is not None and h.n == 19


def test_session_and_request_tables_are_bounded():
    ret = SessionReturns(TemporalParams(), max_sessions=4, max_requests=8)
    for i in range(50):
        ret.request(i, f"s{i}", float(i))
        ret.finished(i, float(i) + 0.5)
    assert len(ret.sessions) == 4 and len(ret.rids) == 8


@pytest.mark.parametrize("bad", [dict(end_factor=0), dict(min_gaps=0), dict(max_sessions=0)])
def test_bad_bounds_are_rejected(bad):
    with pytest.raises(ValueError):
        SessionReturns(TemporalParams(), **bad)


# -- the model of vLLM's CPU manager --------------------------------------------------------


def test_the_host_store_never_holds_more_than_its_chunks():
    st = HostStore(4, HostPolicy(4, clock=Clock()))
    out = st.prepare_store(["a", "b", "c"], "r1")
    assert out == (["a", "b", "c"], [])
    assert st.prepare_store(["d", "e"], "r2") is None, "pending stores cannot be evicted"
    st.complete_store(["a", "b", "c"])
    new, evicted = st.prepare_store(["d", "e"], "r2")
    assert new == ["d", "e"] and len(evicted) == 1 and st.used_chunks <= 4
    assert st.lookup("d") == "pending" and st.lookup(evicted[0]) == "miss"
    st.complete_store(["d", "e"])
    assert st.lookup("d") == "hit"


def test_a_load_pins_its_chunks_and_the_request_reports_its_accesses():
    calls = []

    class Spy(HostPolicy):
        def on_request_finished(self, groups, ins, reused, rid=None):
            calls.append((groups, ins, reused, rid))
            super().on_request_finished(groups, ins, reused, rid)

    st = HostStore(3, Spy(3, clock=Clock()))
    st.prepare_store(["a", "b"], "r1")
    st.complete_store(["a", "b"])
    st.request_finished("r1")
    st.prepare_load(["a"], "r2")
    st.prepare_store(["a", "b", "c"], "r2")
    assert st.prepare_store(["d", "e"], "r3") is None, "a is loading, c being stored"
    st.complete_load(["a"])
    st.request_finished("r2")
    assert calls[0] == ((("a", "b"),), {"a", "b"}, set(), "r1")
    assert calls[1] == ((("a", "b", "c"),), {"c"}, {"a", "b"}, "r2")
    assert st.store_failures == 1
