"""Queued requests (``on_queued``): the agent-aware policies keep the cached prefix of a
request that waits for admission; the simulator announces every queued request once,
before admission; policies that ignore the hook keep their order."""

from __future__ import annotations

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.lru import LRUPolicy
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.cluster import ClusterSim, TimedConfig, build_workload
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from anchorage.trace.format import TraceRecord

BS = 16


def _ctx(rid, keys, now, sid):
    return RequestContext(request_id=rid, keys=list(keys), input_length=len(keys) * BS,
                          now_s=now, session_id=sid)


def _run_turn(pool, ctx):
    alloc = pool.allocate(ctx)
    assert alloc is not None
    pool.free(alloc)
    return alloc.hit_blocks


def _scenario(policy, announce: bool) -> int:
    """Session a (8 blocks) is freed first, session b (8 blocks) later; a's next turn is
    queued, then a flood of 8 new blocks must evict 8 cached ones; returns a's hit."""
    pool = BlockPool(24, BS, policy)
    a1 = list(range(1, 9))
    b1 = list(range(101, 109))
    _run_turn(pool, _ctx("a1", a1, 1.0, "a"))
    _run_turn(pool, _ctx("b1", b1, 2.0, "b"))
    a2 = _ctx("a2", a1 + [9], 3.0, "a")
    if announce:
        policy.on_queued(a2)
    flood = pool.allocate(_ctx("f", list(range(1001, 1017)), 3.1, "f"))
    assert flood is not None
    pool.check_invariants()
    pool.free(flood)
    alloc = pool.allocate(a2)
    assert alloc is not None
    hit = alloc.hit_blocks
    pool.free(alloc)
    pool.check_invariants()
    return hit


@pytest.mark.parametrize("name", ["hybrid", "cachescout", "cachewise"])
def test_queued_request_keeps_its_prefix(name):
    # without the announcement the flood takes the oldest free blocks: a's
    assert _scenario(make_policy(name, block_size=BS), announce=False) == 0
    p = make_policy(name, block_size=BS)
    assert _scenario(p, announce=True) == 8
    assert not p._queued  # admission released the hold
    for s in p.model.sessions.values():
        for g in s.groups.values():
            assert g.hold == 0


def test_lru_ignores_the_announcement():
    assert _scenario(LRUPolicy(), announce=True) == _scenario(LRUPolicy(), announce=False) == 0


def test_a_request_done_without_admission_releases_its_hold():
    p = make_policy("hybrid", block_size=BS)
    pool = BlockPool(24, BS, p)
    _run_turn(pool, _ctx("a1", list(range(1, 9)), 1.0, "a"))
    ctx = _ctx("a2", list(range(1, 10)), 2.0, "a")
    p.on_queued(ctx)
    assert p._queued
    p.on_request_done(ctx)
    assert not p._queued
    assert all(g.hold == 0 for s in p.model.sessions.values() for g in s.groups.values())
    pool.check_invariants()


class _Recorder(LRUPolicy):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def on_queued(self, ctx):
        self.log.append(("queued", ctx.request_id, ctx.now_s))

    def on_request(self, ctx):
        self.log.append(("request", ctx.request_id, ctx.now_s))


def test_simulator_announces_each_request_once_before_admission():
    recs = []
    for s in range(6):
        hist = list(range(s * 100, s * 100 + 4))
        for k in range(3):
            hist = hist + [s * 100 + 50 + k]
            recs.append(TraceRecord(timestamp=s * 10.0 + k * 500.0, hash_ids=list(hist),
                                    input_length=len(hist) * BS, output_length=20,
                                    session_id=f"s{s}", tool_name="bash",
                                    tool_duration_ms=50.0))
    recs.sort(key=lambda r: r.timestamp)
    ctxs = make_contexts(recs)
    prof = get_profile("h200-llama3-8b").with_(block_size=BS, capacity_blocks_override=40,
                                               max_num_seqs=4, max_num_batched_tokens=64)
    cfg = TimedConfig(prof, replicas=1, mode="closed")
    log: list = []
    sim = ClusterSim(cfg, lambda: _Recorder(log), None, pooled=True)
    wl = build_workload(recs, ctxs, cfg)
    sim.run(wl)
    assert len(sim.completed) == len(recs)
    queued = [e for e in log if e[0] == "queued"]
    assert sorted(e[1] for e in queued) == sorted(c.request_id for c in ctxs)
    first_seen = {}
    for kind, rid, t in log:
        first_seen.setdefault(rid, (kind, t))
    assert all(kind == "queued" for kind, _ in first_seen.values())
    by_id = {r.ctx.request_id: r for r in sim.completed}
    for _, rid, t in queued:
        assert t == pytest.approx(by_id[rid].arrival_s)
    # some requests queued behind others: announced before they were admitted
    assert any(r.admitted_s > r.arrival_s for r in sim.completed)
