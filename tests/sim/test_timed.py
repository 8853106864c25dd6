"""The discrete-event simulator: invariants (state drains, no leaked blocks, counters add
up, every request completes), determinism, closed-loop gaps, preemption, routers."""

from __future__ import annotations

import random

import pytest

from anchorage.policies.base import RequestContext
from anchorage.pool.block_pool import BlockPool
from anchorage.policies.lru import LRUPolicy
from anchorage.sim.cluster import ClusterSim, TimedConfig, build_workload, run_timed
from anchorage.sim.engine import Replica, SimRequest, can_allocate
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from anchorage.trace.format import TraceRecord

BS = 16


def tiny_profile(capacity=64, **kw):
    base = dict(block_size=BS, capacity_blocks_override=capacity, max_num_seqs=8,
                max_num_batched_tokens=256)
    base.update(kw)
    return get_profile("h200-llama3-8b").with_(**base)


def session_trace(seed=0, sessions=6, turns=5, shared_blocks=4, tool_ms=200.0):
    """Sessions that share an anchor and grow their own history, with tool gaps."""
    rng = random.Random(seed)
    recs = []
    nid = 1000
    for s in range(sessions):
        hist = list(range(shared_blocks))
        t = s * 50.0
        for k in range(turns):
            add = rng.randint(1, 4)
            hist += list(range(nid, nid + add))
            nid += add
            recs.append(TraceRecord(timestamp=t, hash_ids=list(hist), output_length=rng.randint(1, 40),
                                    input_length=len(hist) * BS - rng.randrange(BS),
                                    session_id=f"s{s}", tool_name="bash",
                                    tool_duration_ms=tool_ms))
            t += 400.0
    recs.sort(key=lambda r: r.timestamp)
    return recs


def simulate(recs, cfg, policy="lru", router="round_robin"):
    ctxs = make_contexts(recs)
    from anchorage.policies.registry import make_policy
    from anchorage.routing.registry import make_router

    def factory():
        return make_policy(policy, block_size=cfg.profile.block_size, contexts=ctxs)
    pooled = router == "pooled"
    sim = ClusterSim(cfg, factory, None if pooled else make_router(router), pooled=pooled)
    wl = build_workload(recs, ctxs, cfg)
    sim.run(wl)
    return sim, wl


def assert_drained(sim, wl):
    assert len(sim.completed) + len(sim.rejected) == len(wl.requests)
    for pool in sim.pools:
        pool.check_invariants()
        assert pool.num_free_blocks == pool.capacity_blocks, "leaked blocks"
    for rep in sim.replicas:
        assert not rep.running and not rep.waiting and not rep.busy
    for r in sim.completed:
        assert r.prefill_tokens == r.hit_tokens + r.computed_tokens
        assert r.arrival_s <= r.first_token_s <= r.finish_s
        assert r.num_output == r.output_len
        assert r.alloc is None


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "ttl", "infercept", "lfu", "belady"])
@pytest.mark.parametrize("mode", ["open", "closed"])
def test_invariants_under_memory_pressure(policy, mode):
    recs = session_trace(seed=1, sessions=8)
    cfg = TimedConfig(tiny_profile(capacity=40), replicas=2, mode=mode)
    sim, wl = simulate(recs, cfg, policy)
    assert_drained(sim, wl)
    assert not sim.rejected
    assert sum(p.stats.evictions for p in sim.pools) > 0


def test_report_counters_add_up_and_are_deterministic():
    recs = session_trace(seed=2)
    cfg = TimedConfig(tiny_profile(capacity=48), replicas=2)
    ctxs = make_contexts(recs)
    a = run_timed(recs, ctxs, cfg, "lru", "round_robin")
    b = run_timed(recs, ctxs, cfg, "lru", "round_robin")
    assert a == b
    assert a["hit_tokens"] + a["recomputed_tokens"] == a["prefill_tokens"]
    assert a["measured_requests"] == a["requests"] == len(recs)
    assert sum(r["requests"] for r in a["per_replica"]) == len(recs)
    assert sum(r["hit_blocks"] for r in a["per_replica"]) == a["hit_blocks"]
    assert a["ttft_p50_s"] <= a["ttft_p90_s"] <= a["ttft_p99_s"]
    assert 0 < a["hit_rate"] < 1
    assert a["replicas"] == 2 and a["router"] == "round_robin"


def test_closed_loop_next_request_waits_for_completion_plus_tool_time():
    recs = [
        TraceRecord(timestamp=0.0, hash_ids=[1, 2], output_length=10, input_length=32,
                    session_id="a", tool_name="t", tool_duration_ms=500.0),
        TraceRecord(timestamp=1.0, hash_ids=[1, 2, 3], output_length=10, input_length=48,
                    session_id="a"),
        TraceRecord(timestamp=2.0, hash_ids=[1, 2, 3, 4], output_length=5, input_length=64,
                    session_id="a"),
    ]
    cfg = TimedConfig(tiny_profile(), replicas=1, mode="closed", think_s=0.25)
    sim, wl = simulate(recs, cfg)
    r0, r1, r2 = sorted(sim.completed, key=lambda r: r.index)
    assert r1.arrival_s == pytest.approx(r0.finish_s + 0.5)
    assert r2.arrival_s == pytest.approx(r1.finish_s + 0.25)  # no tool: think time
    # the session's history is hit: 2 then 3 blocks
    assert (r1.hit_blocks, r2.hit_blocks) == (2, 3)
    # open loop keeps trace times instead
    sim, wl = simulate(recs, TimedConfig(tiny_profile(), mode="open"))
    assert [r.arrival_s for r in sorted(sim.completed, key=lambda r: r.index)] == [0, 0.001, 0.002]


def test_ttft_is_one_prefill_step_when_idle():
    p = tiny_profile(max_num_batched_tokens=4096)
    recs = [TraceRecord(timestamp=0.0, hash_ids=[1, 2, 3], output_length=3, input_length=48)]
    sim, wl = simulate(recs, TimedConfig(p, mode="open"))
    r = sim.completed[0]
    from anchorage.sim.costmodel import step_time_s
    assert r.first_token_s == pytest.approx(step_time_s(p, [(48, 0)]))
    d1 = step_time_s(p, [], [48])
    d2 = step_time_s(p, [], [49])
    assert r.finish_s == pytest.approx(r.first_token_s + d1 + d2)


def test_chunked_prefill_respects_the_token_budget():
    p = tiny_profile(max_num_batched_tokens=32, capacity=64)
    recs = [TraceRecord(timestamp=0.0, hash_ids=list(range(1, 7)), output_length=1,
                        input_length=96)]
    sim, wl = simulate(recs, TimedConfig(p, mode="open"))
    rep = sim.replicas[0]
    assert rep.stats.steps == 3  # 96 tokens in chunks of 32
    assert_drained(sim, wl)


def test_long_prefill_cap_chunks_a_prefill_only_beside_other_requests():
    """vLLM's long_prefill_token_threshold: a request alone prefills with the whole budget;
    beside another, its chunks are at most the cap, and the short request behind a long
    prompt gets its first token before the long prefill is done (without the cap it
    waits for all of it)."""
    p = tiny_profile(max_num_batched_tokens=256, capacity=64)
    alone = [TraceRecord(timestamp=0.0, hash_ids=list(range(1, 17)), output_length=1,
                         input_length=256)]
    sim, _ = simulate(alone, TimedConfig(p, mode="open", long_prefill_tokens=32))
    assert sim.replicas[0].stats.steps == 1                # nobody to starve: no cap

    p = tiny_profile(max_num_batched_tokens=256, capacity=128)
    long_then_short = [TraceRecord(timestamp=0.0, hash_ids=list(range(1, 65)), output_length=1,
                                   input_length=1024),
                       TraceRecord(timestamp=0.0, hash_ids=[100], output_length=1,
                                   input_length=16)]
    ttft = {}
    for cap in (0, 32):
        sim, wl = simulate(long_then_short, TimedConfig(p, mode="open", long_prefill_tokens=cap))
        assert_drained(sim, wl)
        long_r, short_r = sorted(sim.completed, key=lambda r: r.prompt_len, reverse=True)
        ttft[cap] = (long_r.first_token_s, short_r.first_token_s - short_r.arrival_s)
    # uncapped: the short request waits for the long prompt's four 256-token steps
    assert ttft[0][1] >= ttft[0][0]
    # capped: the short one is served in the second step (the first started with the long
    # request alone), beside a 32-token chunk
    assert ttft[32][1] < ttft[0][1] / 2
    assert ttft[32][0] > ttft[0][0]                         # the long one pays a little
    with pytest.raises(ValueError):
        TimedConfig(p, long_prefill_tokens=-1)


def test_preemption_recomputes_and_everything_drains():
    # long outputs on a small pool: decodes run out of blocks and preempt
    recs = [TraceRecord(timestamp=0.0, hash_ids=[10 * i + j for j in range(3)], output_length=120,
                        input_length=48) for i in range(6)]
    p = tiny_profile(capacity=40, max_num_seqs=6)
    sim, wl = simulate(recs, TimedConfig(p, mode="open"))
    assert sum(r.preemptions for r in sim.completed) > 0
    assert_drained(sim, wl)
    pre = [r for r in sim.completed if r.preemptions]
    assert all(r.prefill_tokens > r.prompt_len for r in pre)  # recomputed prompt + output


def test_oversize_requests_are_rejected_not_hung():
    recs = [TraceRecord(timestamp=0.0, hash_ids=list(range(100)), output_length=1,
                        input_length=1600),
            TraceRecord(timestamp=0.0, hash_ids=[1], output_length=1, input_length=16)]
    sim, wl = simulate(recs, TimedConfig(tiny_profile(capacity=20), mode="open"))
    assert len(sim.rejected) == 1 and len(sim.completed) == 1
    assert_drained(sim, wl)


def test_pooled_shares_one_cache_of_the_fleet_size():
    recs = session_trace(seed=3, sessions=8)
    cfg = TimedConfig(tiny_profile(capacity=30), replicas=3)
    sim, wl = simulate(recs, cfg, router="pooled")
    assert len(sim.pools) == 1 and sim.pools[0].capacity_blocks == 90
    assert {r.replica for r in sim.completed} == {0, 1, 2}
    assert_drained(sim, wl)
    ctxs = make_contexts(recs)
    pooled = run_timed(recs, ctxs, cfg, "lru", "pooled")
    rr = run_timed(recs, ctxs, cfg, "lru", "round_robin")
    assert pooled["hit_rate"] >= rr["hit_rate"]  # anchors cached once, sessions never split


def test_round_robin_spreads_and_kv_event_routers_work():
    recs = session_trace(seed=4, sessions=6)
    cfg = TimedConfig(tiny_profile(capacity=64), replicas=3)
    sim, wl = simulate(recs, cfg)
    counts = [sum(1 for r in sim.completed if r.replica == i) for i in range(3)]
    assert max(counts) - min(counts) <= 1
    from anchorage.routing.registry import router_names
    for name in router_names():
        sim, wl = simulate(recs, cfg, router=name)
        assert_drained(sim, wl)


def test_warmup_requests_are_run_but_not_measured():
    recs = session_trace(seed=5, sessions=4)
    recs[0].extra = {"warmup": True}
    cfg = TimedConfig(tiny_profile(), replicas=1, mode="open", warmup_s=0.06)
    ctxs = make_contexts(recs)
    out = run_timed(recs, ctxs, cfg, "lru")
    early = sum(1 for r in recs if r.timestamp / 1000 < 0.06)
    assert out["requests"] == len(recs)
    assert out["measured_requests"] == len(recs) - max(early, 1)


def test_can_allocate_agrees_with_allocate():
    rng = random.Random(7)
    pool = BlockPool(12, 4, LRUPolicy())
    held = []
    for i in range(300):
        keys = [("k", rng.randrange(6), j) for j in range(rng.randint(1, 5))]
        ctx = RequestContext(request_id=i, keys=keys, input_length=len(keys) * 4)
        n = len(keys) * 4 + rng.randrange(8)
        ok = can_allocate(pool, ctx, n)
        a = pool.allocate(ctx, n)
        assert ok == (a is not None)
        if a is not None:
            held.append(a)
        if held and (rng.random() < 0.5 or a is None):
            pool.free(held.pop(rng.randrange(len(held))))


def test_config_validation():
    p = tiny_profile()
    for bad in (dict(replicas=0), dict(mode="x"), dict(time_scale=0), dict(think_s=-1),
                dict(capacity_blocks=0)):
        with pytest.raises(ValueError):
            TimedConfig(p, **bad)


def test_session_slots_gate_session_starts():
    recs = session_trace(seed=6, sessions=4, turns=3)
    for r in recs:  # every session would start at once
        r.timestamp = 0.0
    cfg = TimedConfig(tiny_profile(capacity=64), replicas=1, max_sessions=1)
    sim, wl = simulate(recs, cfg)
    assert_drained(sim, wl)
    by_session = {}
    for r in sim.completed:
        by_session.setdefault(r.session, []).append(r)
    spans = sorted((min(r.arrival_s for r in rs), max(r.finish_s for r in rs))
                   for rs in by_session.values())
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert b0 == pytest.approx(a1)  # the next session starts when the slot frees
    ctxs = make_contexts(recs)
    out = run_timed(recs, ctxs, TimedConfig(tiny_profile(capacity=64), max_sessions=2), "lru")
    assert out["window_s"] is not None and out["throughput_rps"] > 0
    assert out["measured_requests"] < out["requests"]
    with pytest.raises(ValueError):
        TimedConfig(tiny_profile(), mode="open", max_sessions=2)


def test_policy_anchor_labels_reach_the_router():
    from anchorage.policies.lru import LRUPolicy
    from anchorage.routing.base import Router

    class Labelled(LRUPolicy):
        def anchor_labels(self):
            return ["agent-x"]

    seen = []

    class Spy(Router):
        def pick(self, ctx, replicas):
            seen.append([v.extra.get("anchors") for v in replicas])
            return 0

    recs = session_trace(seed=8, sessions=2, turns=2)
    cfg = TimedConfig(tiny_profile(), replicas=2)
    sim = ClusterSim(cfg, Labelled, Spy())
    sim.run(build_workload(recs, make_contexts(recs), cfg))
    assert seen and all(s == [["agent-x"], ["agent-x"]] for s in seen)


def test_steady_state_window_applies_to_every_metric():
    # warmup_frac leaves the ramp-up out of TTFT and hit rate, not only out of turns/s
    from anchorage.sim.cluster import summarize
    recs = session_trace(seed=7, sessions=8, turns=3)
    cfg = TimedConfig(tiny_profile(capacity=64), replicas=1, max_sessions=2, warmup_frac=0.5)
    sim, wl = simulate(recs, cfg)
    out = summarize(sim, wl, "lru", "round_robin")
    lo, hi = out["window_s"]
    inside = [r for r in sim.completed if r.measured and lo <= r.arrival_s <= hi]
    assert 0 < len(inside) < len([r for r in sim.completed if r.arrival_s <= hi])
    assert out["measured_requests"] == len(inside)
    ttft = sum(r.first_token_s - r.arrival_s for r in inside) / len(inside)
    assert out["ttft_mean_s"] == pytest.approx(ttft)


def cold_then_hot(params=None):
    """One seat, held by a busy request; a cold request (10 new blocks) queues at 0.1 s,
    a hot one (1 new block: 20 of its 21 cached) at 0.2 s. Returns the replica, the plan
    of the step when the seat frees, the two requests and that step's time."""
    prof = tiny_profile(capacity=64, max_num_seqs=1, max_num_batched_tokens=4096)
    pool = BlockPool(64, BS, LRUPolicy())
    rep = Replica(0, prof, pool, admission="prefix-aware", admission_params=params)
    warm = RequestContext(request_id="w", keys=list(range(20)), input_length=20 * BS)
    pool.free(pool.allocate(warm))  # 20 cached blocks
    busy = SimRequest(RequestContext(request_id="b", keys=[900], input_length=BS,
                                     output_length=3), 0.0)
    rep.enqueue(busy)
    rep.finish_step(rep.plan_step(0.0))  # busy holds the only seat: the next ones queue
    cold = SimRequest(RequestContext(request_id="c", keys=list(range(100, 110)),
                                     input_length=10 * BS), 0.1)
    hot = SimRequest(RequestContext(request_id="h", keys=list(range(21)),
                                    input_length=21 * BS), 0.2)
    rep.enqueue(cold)
    rep.enqueue(hot)
    t = 0.3
    while busy.finish_s is None:
        rep.finish_step(rep.plan_step(t))
        t += 0.1
    return rep, rep.plan_step(t), cold, hot, t


def test_prefix_aware_admission_admits_fewest_new_blocks_first():
    rep, plan, cold, hot, _ = cold_then_hot()
    # hot needs 1 new block, cold 10: hot first though it arrived later
    assert plan.items[0][0] is hot
    assert list(rep.waiting) == [cold]
    prof = rep.profile
    fcfs = Replica(1, prof, BlockPool(64, BS, LRUPolicy()))
    assert fcfs.admission == "fcfs"
    with pytest.raises(ValueError, match="admission"):
        Replica(2, prof, rep.pool, admission="sjf")
    with pytest.raises(ValueError, match="admission"):
        TimedConfig(prof, admission="sjf")


def test_a_ttft_target_puts_a_request_near_it_first():
    """The replica's ``admission_params``: the cold request arrived first and has waited
    past half the target when the seat frees, so it goes before the hot one; without a
    target (above) the hot one goes first."""
    from anchorage.policies.admission import AdmissionParams

    def first_admitted(params):
        _, plan, _, _, t = cold_then_hot(params)
        return plan.items[0][0].ctx.request_id, t

    assert first_admitted(None)[0] == "h"
    rid, t = first_admitted(AdmissionParams(ttft_target_s=0.7))   # urgent after 0.35 s
    assert rid == "c" and 0.35 <= t - 0.1 < 0.7 and t - 0.2 < 0.35, t
    # past the target both are late; hot's fewer new blocks put it first again
    assert first_admitted(AdmissionParams(ttft_target_s=0.05, late_after=100))[0] == "h"
    with pytest.raises(ValueError, match="unknown admission parameter"):
        TimedConfig(tiny_profile(capacity=64), admission="prefix-aware",
                    admission_params={"slo": 1})


def test_prefix_aware_admission_drains_and_is_deterministic():
    recs = session_trace(seed=3, sessions=8, turns=4)
    cfg = TimedConfig(tiny_profile(capacity=48), replicas=2, mode="closed",
                      admission="prefix-aware")
    sim, wl = simulate(recs, cfg, "hybrid")
    assert_drained(sim, wl)
    a = run_timed(recs, make_contexts(recs), cfg, "hybrid")
    b = run_timed(recs, make_contexts(recs), cfg, "hybrid")
    assert a == b
