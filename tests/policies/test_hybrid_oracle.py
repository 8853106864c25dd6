"""`hybrid-oracle`: the oracle-ladder reference (hybrid + ground truth), offline only."""

from __future__ import annotations

import pytest

from anchorage.policies.base import RequestContext, next_in_session
from anchorage.policies.hybrid_oracle import LADDER, parse_know
from anchorage.policies.registry import is_offline, make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay
from tests.policies.agent_workload import pipeline_workload, unique_blocks


def test_parse_know_levels_and_names():
    assert parse_know("L0") == frozenset()
    assert parse_know("L2") == {"tool", "end"}
    assert parse_know("L5") == set(LADDER["L5"]) == {"tool", "end", "next", "thread", "anchor"}
    assert parse_know("end, thread") == {"end", "thread"}
    with pytest.raises(ValueError, match="unknown knowledge 'future'"):
        parse_know("end,future")


def test_next_in_session_reads_each_sessions_next_request():
    def ctx(seq, sid):
        return RequestContext(request_id=seq, keys=[], input_length=16, now_s=float(seq),
                              session_id=sid, seq=seq)
    ctxs = [ctx(0, "a"), ctx(1, "b"), ctx(2, None), ctx(3, "a"), ctx(4, "a")]
    nxt = next_in_session(ctxs)
    assert [None if c is None else c.seq for c in nxt] == [3, None, None, 4, None]


def test_offline_and_bad_parameter_is_a_clear_error():
    assert is_offline("hybrid-oracle")
    with pytest.raises(ValueError, match="reads the future"):
        make_policy("hybrid-oracle")
    ctxs = pipeline_workload(seed=1, sessions=4, steps=3)
    with pytest.raises(ValueError, match="accepted: tool, end"):
        make_policy("hybrid-oracle", contexts=ctxs, know="L9")


def test_level_zero_is_exactly_hybrid():
    ctxs = pipeline_workload(seed=2, agents=4, sessions=30, steps=8)
    cap = max(unique_blocks(ctxs) // 10, 64)
    a = replay(ctxs, cap, 16, make_policy("hybrid"))
    b = replay(ctxs, cap, 16, make_policy("hybrid-oracle", contexts=ctxs, know="L0"))
    assert (a.hit_blocks, a.evictions) == (b.hit_blocks, b.evictions)


def _req(i, sid, keys, t, agent):
    return RequestContext(request_id=i, keys=keys, input_length=16 * len(keys),
                          output_length=0, now_s=t, session_id=sid, seq=i, agent_truth=agent)


def test_end_knowledge_evicts_a_finished_session_first():
    # s1 ends after its request at t=1; s2 (freed earlier) comes back at t=5
    ctxs = [_req(0, "s2", [10, 11, 12], 0.0, "a"), _req(1, "s1", [20, 21, 22], 1.0, "b"),
            _req(2, "s2", [10, 11, 12, 13], 5.0, "a")]
    orders = {}
    for know in ("L0", "end"):
        pol = make_policy("hybrid-oracle", contexts=ctxs, know=know)
        pool = BlockPool(64, 16, pol)
        for c in ctxs[:2]:
            pool.free(pool.allocate(c))
        orders[know] = [pool.block_key[b] for b in pol.eviction_order()]
    assert orders["L0"][:3] == [12, 11, 10]  # recency: s2 freed first, evicted first
    assert orders["end"][:3] == [22, 21, 20]  # s1 is known to be over


def test_thread_knowledge_orders_threads_by_true_next_use():
    # both sessions come back, s1 (freed last) much later than s2
    ctxs = [_req(0, "s2", [10, 11], 0.0, "a"), _req(1, "s1", [20, 21], 1.0, "b"),
            _req(2, "s2", [10, 11, 12], 2.0, "a"), _req(3, "s1", [20, 21, 22], 90.0, "b")]
    firsts = {}
    for know in ("L0", "thread"):
        pol = make_policy("hybrid-oracle", contexts=ctxs, know=know)
        pool = BlockPool(64, 16, pol)
        for c in ctxs[:2]:
            pool.free(pool.allocate(c))
        firsts[know] = [pool.block_key[b] for b in pol.eviction_order()][:2]
    assert firsts == {"L0": [11, 10], "thread": [21, 20]}


def test_ladder_helps_on_an_agent_workload():
    ctxs = pipeline_workload(seed=3, agents=4, sessions=40, steps=8)
    cap = max(unique_blocks(ctxs) // 20, 64)
    hyb = replay(ctxs, cap, 16, make_policy("hybrid")).hit_rate
    top = replay(ctxs, cap, 16, make_policy("hybrid-oracle", contexts=ctxs, know="L4")).hit_rate
    bel = replay(ctxs, cap, 16, make_policy("belady", contexts=ctxs)).hit_rate
    assert hyb < top <= bel + 1e-9
