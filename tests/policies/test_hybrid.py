"""hybrid: degrades to exact LRU without signal, pool invariants on random traces
(property-based), determinism, value on a multi-agent workload, hot-path shape."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy, policy_names
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay
from tests.policies.agent_workload import pipeline_workload, unique_blocks

AGENT_AWARE = ("hybrid", "cachescout", "cachewise")


def test_registered():
    names = policy_names()
    for n in AGENT_AWARE + ("cachewise-oracle",):
        assert n in names


def _no_signal_trace(seed: int, n: int = 300) -> list[RequestContext]:
    """Sessions re-reading and extending their own chains; no tools, no outputs, no shared
    prefixes, one timestamp (no timing): nothing for an agent-aware policy to learn. A
    session that branches off (truncates) keeps the old branch and often goes back to it,
    so blocks a prompt skipped are reused as often as any (no "stale" signal either)."""
    rng = random.Random(seed)
    chains: dict[int, list[int]] = {}
    branches: dict[int, list[list[int]]] = {}
    out = []
    nxt = 1
    for i in range(n):
        s = rng.randrange(12)
        ch = chains.setdefault(s, [])
        old = branches.setdefault(s, [])
        if old and rng.random() < 0.5:
            old.append(ch)
            ch = chains[s] = list(old.pop(-2))
            del old[:-2]
        elif ch and (rng.random() < 0.3 or len(ch) > 16):
            old.append(ch)
            ch = chains[s] = ch[: rng.randrange(1, len(ch) + 1)]
        for _ in range(rng.randrange(1, 5)):
            ch.append(nxt)
            nxt += 1
        out.append(RequestContext(request_id=i, keys=list(ch), input_length=len(ch) * 16 + 1,
                                  now_s=0.0, session_id=f"s{s}", seq=i))
    return out


def _lockstep(ctxs, cap, a, b):
    return lockstep_pools(ctxs, BlockPool(cap, 16, a), BlockPool(cap, 16, b))


def lockstep_pools(ctxs, pa, pb):
    """Both pools take ``ctxs`` one at a time: same hits, same blocks, same order."""
    for c in ctxs:
        ra, rb = pa.allocate(c), pb.allocate(c)
        # a prompt longer than the pool does not fit: both pools refuse it alike
        assert (ra is None) == (rb is None)
        if ra is None:
            continue
        assert ra.hit_blocks == rb.hit_blocks
        assert ra.blocks == rb.blocks
        pa.free(ra)
        pb.free(rb)
        assert pa.policy_order_snapshot() == pb.policy_order_snapshot()
    return pa, pb


def test_hybrid_is_exactly_lru_without_signal():
    ctxs = _no_signal_trace(1)
    for cap in (40, 90, 200):
        _lockstep(ctxs, cap, make_policy("lru"), make_policy("hybrid"))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(30, 150))
def test_hybrid_is_lru_without_signal_property(seed, cap):
    _lockstep(_no_signal_trace(seed, 120), cap, make_policy("lru"), make_policy("hybrid"))


@st.composite
def traces(draw):
    """Random multi-session traces with shared anchors, tools, outputs and timing."""
    n = draw(st.integers(5, 40))
    rng = random.Random(draw(st.integers(0, 10_000)))
    anchors = [[1000 * a + i for i in range(rng.randrange(1, 5))] for a in range(3)]
    hist: dict[int, list[int]] = {}
    t = 0.0
    out = []
    for i in range(n):
        s = rng.randrange(5)
        a = rng.randrange(3)
        h = hist.setdefault(s * 10 + a, [])
        h.extend(10_000 + i * 10 + j for j in range(rng.randrange(0, 4)))
        keys = anchors[a] + list(h)
        t += rng.choice((0.0, 0.1, 1.0, 30.0))
        out.append(RequestContext(
            request_id=i, keys=keys, input_length=len(keys) * 16 - rng.randrange(0, 8),
            output_length=rng.randrange(0, 40), now_s=t,
            session_id=None if rng.random() < 0.2 else f"s{s}",
            tool_name=rng.choice((None, "read", "test")), tool_args={"p": rng.randrange(3)},
            warmup=rng.random() < 0.05, seq=i))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ctxs=traces(), cap=st.integers(8, 60), name=st.sampled_from(AGENT_AWARE))
def test_pool_invariants_hold(ctxs, cap, name):
    pol = make_policy(name, block_size=16)
    res = replay(ctxs, cap, 16, pol, check_every=1)
    assert 0.0 <= res.hit_rate <= 1.0
    # everything freed: the policy orders exactly the cached free blocks, no duplicates
    order = list(pol.eviction_order())
    assert len(order) == len(set(order))


def test_deterministic_for_a_seed():
    ctxs = pipeline_workload(seed=5, sessions=30)
    cap = max(unique_blocks(ctxs) // 15, 64)
    for name in AGENT_AWARE:
        runs = []
        for _ in range(2):
            pol = make_policy(name, block_size=16)
            pool = BlockPool(cap, 16, pol)
            for c in ctxs:
                pool.free(pool.allocate(c))
            runs.append((pool.stats.hit_blocks, pool.stats.evictions,
                         list(pol.eviction_order())))
        assert runs[0] == runs[1], name


def test_hybrid_beats_lru_on_a_multi_agent_workload():
    ctxs = pipeline_workload(seed=6, agents=4, sessions=40, steps=8)
    cap = max(unique_blocks(ctxs) // 20, 64)
    lru = replay(ctxs, cap, 16, make_policy("lru")).hit_rate
    hyb = replay(ctxs, cap, 16, make_policy("hybrid")).hit_rate
    bel = replay(ctxs, cap, 16, make_policy("belady", contexts=ctxs)).hit_rate
    assert lru < hyb <= bel


def test_generated_blocks_learned_dead_go_first():
    ctxs = pipeline_workload(seed=7, sessions=20, output_length=64)
    pol = make_policy("hybrid", block_size=16)
    pool = BlockPool(100_000, 16, pol)
    for c in ctxs:
        a = pool.allocate(c)
        total = c.input_length + c.output_length - 1
        pool.grow(a, total)
        pool.cache_generated_blocks(a, total)
        pool.free(a)
    first = list(pol.eviction_order())[:10]
    assert all(isinstance(pool.block_key[b], tuple) and pool.block_key[b][0] == "gen"
               for b in first)


def test_rescoring_between_two_allocations_sees_emptied_groups():
    """A hit that empties a group's free blocks, then a re-scoring before any free or
    eviction (two allocations in a row, as tiering's reloads do), must not fail."""
    ctxs = pipeline_workload(seed=2, sessions=6, steps=3)
    pol = make_policy("hybrid", block_size=16)
    pool = BlockPool(10_000, 16, pol)
    for c in ctxs[:-1]:
        pool.free(pool.allocate(c))
    again = RequestContext(request_id="again", keys=ctxs[-2].keys,
                           input_length=ctxs[-2].input_length, now_s=ctxs[-1].now_s,
                           session_id=ctxs[-2].session_id)
    a = pool.allocate(again)
    assert a.hit_blocks > 0
    pol._rescore()  # what on_request does once the clock has advanced enough
    pool.allocate(ctxs[-1])
    order = list(pol.eviction_order())
    assert len(order) == len(set(order))
