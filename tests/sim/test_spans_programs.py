"""Decode spans, the program gate seam and Continuum's pins in the timed simulator."""

from __future__ import annotations

import pytest

from anchorage.pool.block_pool import BlockPool
from anchorage.policies.lru import LRUPolicy
from anchorage.sim.cluster import TimedConfig, simulate_timed
from anchorage.sim.costmodel import decode_span_ends, decode_step_s, step_time_s
from anchorage.sim.engine import Replica, SimRequest
from anchorage.sim.profiles import PROFILES
from anchorage.sim.replay import make_contexts
from anchorage.sim.retention import ContinuumPins, PinParams, ToolTimes, pin_ttl_s
from anchorage.policies.base import RequestContext
from tests.sim.test_timed import session_trace, tiny_profile


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_decode_step_and_span_equal_the_step_cost(name):
    p = PROFILES[name]
    ctxs = [10, 2000, 31]
    assert decode_step_s(p, 3, sum(ctxs)) == step_time_s(p, [], ctxs)
    ends = decode_span_ends(p, 3, sum(ctxs), 40, 5.0)
    t = 5.0
    for j, e in enumerate(ends):
        t += step_time_s(p, [], [c + j for c in ctxs])
        assert e == pytest.approx(t, rel=1e-12)
    assert len(decode_span_ends(p, 3, sum(ctxs), 40, 5.0, horizon_s=ends[4])) == 5


def _metrics(recs, cfg, policy="lru", router="session"):
    ctxs = make_contexts(recs)
    _, r = simulate_timed(recs, ctxs, cfg, policy, router)
    return r


def test_spans_reproduce_the_step_by_step_simulation_without_cache_pressure():
    recs = session_trace(seed=3, sessions=8, turns=6)
    for rec in recs:
        rec.output_length = 60          # long decodes: spans of many steps
    base = dict(replicas=2, mode="closed", max_sessions=4)
    on = _metrics(recs, TimedConfig(tiny_profile(capacity=4000), **base))
    off = _metrics(recs, TimedConfig(tiny_profile(capacity=4000), decode_spans=False, **base))
    for k in ("measured_requests", "hit_blocks", "preemptions", "recomputed_tokens"):
        assert on[k] == off[k]
    for k in ("ttft_mean_s", "latency_mean_s", "makespan_s", "throughput_rps"):
        assert on[k] == pytest.approx(off[k], rel=1e-9)


def test_spans_keep_pool_invariants_under_pressure():
    recs = session_trace(seed=5, sessions=10, turns=6)
    for rec in recs:
        rec.output_length = 50
    ctxs = make_contexts(recs)
    sim, r = simulate_timed(recs, ctxs, TimedConfig(tiny_profile(capacity=48), replicas=2,
                                                    mode="closed", max_sessions=6),
                            "lru", "round_robin")
    assert r["measured_requests"] + r["rejected"] >= 1
    for p in sim.pools:
        p.check_invariants()
        assert p.num_free_blocks == p.capacity_blocks  # every block came back


def test_pin_rule_and_tool_time_estimate():
    p = PinParams()
    assert pin_ttl_s(None, None, p) == 0.0            # no tool call: no pin
    assert pin_ttl_s("ls", None, p) == 2.0            # unknown tool: estimate 0
    assert pin_ttl_s("ls", 1.9, p) == 2.0
    assert pin_ttl_s("pytest", 2.1, p) == 0.0         # longer than the 2 s threshold
    t = ToolTimes()
    t.observe("ls", 1.0)
    t.observe("ls", 4.0)
    assert t.estimate("ls") == 2.5 and t.estimate("x") is None


def test_continuum_pins_hold_blocks_until_expiry_and_learn_gaps():
    pins = ContinuumPins()
    assert pins.on_complete("s", "ls", 10.0) == 12.0
    pins.on_arrival("s", 13.0)                 # gap 3 s learned for ls
    assert pins.times.estimate("ls") == 3.0
    assert pins.on_complete("s", "ls", 20.0) == 0.0   # mean 3 s > 2 s: no pin now
    prof = tiny_profile(capacity=32)
    rep = Replica(0, prof, BlockPool(32, 16, LRUPolicy()))
    rep.retention = ContinuumPins()
    ctx = RequestContext(request_id=1, keys=[1, 2, 3, 4], input_length=64, output_length=1,
                         session_id="s", tool_name="ls")
    req = SimRequest(ctx, 0.0, session="s")
    rep.enqueue(req)
    now = 0.0
    while rep.has_work:
        plan = rep.plan_step(now)
        now += plan.duration_s
        rep.finish_step(plan)
    assert "s" in rep.retention.pins                  # pinned: its 4 blocks stay in use
    assert rep.pool.num_free_blocks == 28
    rep.plan_step(now + 1.0)                          # not expired yet
    assert rep.pool.num_free_blocks == 28
    rep.plan_step(now + 2.5)                          # expired, nothing of s waiting
    assert rep.pool.num_free_blocks == 32 and not rep.retention.pins


@pytest.mark.parametrize("yields", [False, True])
def test_retained_kv_yields_to_a_waiting_request_only_when_configured(yields):
    """A replica whose stalled agents pin every block: with ``yield_to_waiting`` the
    waiting request takes the pin that expires last at once; without, it waits for the
    pins' expiry (Continuum's rule)."""
    prof = tiny_profile(capacity=8)
    rep = Replica(0, prof, BlockPool(8, 16, LRUPolicy()))
    rep.retention = ContinuumPins(PinParams(ttl_s=1e9, threshold_s=1e9,
                                            yield_to_waiting=yields))

    def run(sid, keys, now):
        ctx = RequestContext(request_id=sid, keys=keys, input_length=16 * len(keys),
                             output_length=1, session_id=sid, tool_name="ls")
        rep.enqueue(SimRequest(ctx, now, session=sid))
        for _ in range(50):
            plan = rep.plan_step(now)
            if plan is None:
                break
            now += plan.duration_s
            rep.finish_step(plan)
        return now

    now = run("a", [1, 2, 3, 4], 0.0)
    now = run("b", [5, 6, 7, 8], now)
    assert set(rep.retention.pins) == {"a", "b"} and rep.pool.num_free_blocks == 0
    run("c", [9, 10, 11, 12], now)
    if yields:
        assert set(rep.retention.pins) == {"a", "c"}   # b stalled last: its KV went
        assert rep.retention.released_early == 1 and not rep.waiting
    else:
        assert set(rep.retention.pins) == {"a", "b"} and len(rep.waiting) == 1


def test_program_fcfs_orders_by_session_start_and_preempts_the_latest_session():
    prof = tiny_profile(capacity=64, max_num_seqs=1)
    rep = Replica(0, prof, BlockPool(64, 16, LRUPolicy()), admission="program-fcfs")

    def req(i, sid, t):
        c = RequestContext(request_id=i, keys=[i * 10 + k for k in range(2)],
                           input_length=32, output_length=2, session_id=sid)
        return SimRequest(c, t, session=sid, index=i)

    rep.enqueue(req(1, "old", 0.0))     # session "old" first seen at 0
    rep.enqueue(req(2, "new", 1.0))
    rep.enqueue(req(3, "old", 2.0))     # arrives last, but its program started first
    rep.plan_step(3.0)
    assert [r.index for r in rep.running] == [1]
    assert [r.index for r in rep.waiting] == [3, 2]
    from anchorage.sim.queues import victim
    assert victim(rep, 0).index == 1


def test_thunderagent_gate_runs_and_accounts_for_every_request():
    recs = session_trace(seed=2, sessions=8, turns=4)
    ctxs = make_contexts(recs)
    cfg = TimedConfig(tiny_profile(capacity=64), replicas=2, mode="closed", max_sessions=8,
                      program_gate="thunderagent", program_gate_params={"interval_s": 0.5})
    sim, r = simulate_timed(recs, ctxs, cfg, "lru", "round_robin")
    assert sim.router is None and sim.gate is not None
    assert len(sim.completed) + len(sim.rejected) == len(recs)
    assert not sim.gate.held
    with pytest.raises(ValueError, match="program_gate"):
        TimedConfig(tiny_profile(), program_gate="nope")
