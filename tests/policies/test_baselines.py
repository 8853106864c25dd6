"""Baseline policies (arc, lfu, s3fifo, ttl, infercept): their rules, and the pool's
invariants under random concurrent traces."""

from __future__ import annotations

import random

import pytest

from anchorage.policies.arc import ARCPolicy
from anchorage.policies.base import RequestContext
from anchorage.policies.infercept import InferCeptPolicy, ema
from anchorage.policies.lfu import LFUPolicy
from anchorage.policies.registry import make_policy, policy_names
from anchorage.policies.s3fifo import S3FIFOPolicy
from anchorage.policies.ttl import TTLPolicy
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay

BASELINES = ["arc", "lfu", "s3fifo", "ttl", "infercept"]
BS = 4


def ctx(keys, t=0.0, session=None, rid=None, **kw):
    return RequestContext(request_id=rid if rid is not None else id(keys), keys=list(keys),
                          input_length=len(keys) * BS, now_s=t, session_id=session, **kw)


def run_one(pool, c):
    a = pool.allocate(c)
    assert a is not None
    pool.free(a)
    return a


def random_contexts(seed, n=400, sessions=12, shared=3):
    """Sessions that extend their own history and share a few system prompts."""
    rng = random.Random(seed)
    hist = {s: [("sys", s % shared, i) for i in range(rng.randint(1, 4))] for s in range(sessions)}
    out, t = [], 0.0
    for i in range(n):
        s = rng.randrange(sessions)
        h = hist[s]
        if rng.random() < 0.1:  # session restarts
            h = hist[s] = [("sys", s % shared, j) for j in range(rng.randint(1, 4))]
        h.extend((s, i, j) for j in range(rng.randint(1, 5)))
        t += rng.expovariate(5.0)
        out.append(RequestContext(request_id=i, keys=list(h), input_length=len(h) * BS - rng.randrange(BS),
                                  output_length=rng.randint(0, 9), now_s=t, session_id=f"s{s}",
                                  tool_name=rng.choice([None, "bash", "read"]), seq=i))
    return out


def test_registry_lists_baselines():
    names = policy_names()
    for n in BASELINES:
        assert n in names
        p = make_policy(n, block_size=BS)
        assert p.name == n


@pytest.mark.parametrize("name", BASELINES)
def test_sequential_replay_invariants(name):
    contexts = random_contexts(1)
    pol = make_policy(name, block_size=BS)
    res = replay(contexts, 40, BS, pol, check_every=1)
    assert res.requests == len(contexts)
    assert 0 < res.hit_blocks < res.prompt_blocks
    assert res.evictions > 0


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("seed", [2, 3])
def test_concurrent_random_invariants(name, seed):
    """Requests overlap: blocks in use must never be victims; state drains at the end."""
    rng = random.Random(seed)
    contexts = random_contexts(seed, n=300)
    pol = make_policy(name, block_size=BS)
    pool = BlockPool(60, BS, pol)
    running = []
    for c in contexts:
        a = pool.allocate(c)
        while a is None and running:
            pool.free(running.pop(rng.randrange(len(running))))
            a = pool.allocate(c)
        if a is None:
            continue
        if rng.random() < 0.5 and pool.grow(a, c.input_length + c.output_length):
            pool.cache_generated_blocks(a, c.input_length + c.output_length)
        running.append(a)
        if len(running) > 4:
            pool.free(running.pop(rng.randrange(len(running))))
        pool.check_invariants()
    for a in running:
        pool.free(a)
    pool.check_invariants()
    assert pool.num_free_blocks == pool.capacity_blocks
    assert sorted(pol.eviction_order()) == sorted(
        b for b in range(1, 61) if pool.block_key[b] is not None)
    # every cached block can be evicted, one at a time, and then nothing is left
    n = pool.num_cached_free_blocks
    for _ in range(n):
        assert pool._pick_victim() is not None
    assert pol.pop_victim() is None
    assert pool.reset_prefix_cache() or True


# -- arc -----------------------------------------------------------------------------------

def test_arc_frequent_blocks_survive_a_scan():
    pol = ARCPolicy()
    pool = BlockPool(8, BS, pol)
    hot = ctx(["h0", "h1", "h2"])
    run_one(pool, hot)
    run_one(pool, ctx(["h0", "h1", "h2", "x"]))  # h0, h1 hit: they move to T2
    for i in range(6):  # a scan of one-time blocks
        run_one(pool, ctx([f"scan{i}", f"scan{i}b"]))
    assert pool.get_cached_block("h0") is not None and pool.get_cached_block("h1") is not None


def test_arc_ghost_hit_adapts_p():
    pol = ARCPolicy()
    pool = BlockPool(4, BS, pol)
    run_one(pool, ctx(["a", "b"]))
    run_one(pool, ctx(["a", "b", "x"]))  # a, b hit: T2; x in T1
    run_one(pool, ctx(["e", "f"]))       # |T1| = 1 > p = 0: x is evicted into B1
    assert pol.p == 0
    assert list(pol._b1) == ["x"]
    assert pool.get_cached_block("a") is not None
    run_one(pool, ctx(["x", "y"]))       # 'x' is a B1 ghost: p grows, 'x' enters T2
    assert pol.p == 1
    assert "x" not in pol._b1
    assert pol._list[pool.get_cached_block("x")] == 2
    # ARC's bound: |T1| + |B1| <= c and everything <= 2c
    assert pol._size[1] + len(pol._b1) <= 4
    assert sum(pol._size.values()) + len(pol._b1) + len(pol._b2) <= 8


def test_arc_lru_within_list():
    pol = ARCPolicy()
    pool = BlockPool(6, BS, pol)
    run_one(pool, ctx(["a", "b"]))
    run_one(pool, ctx(["c", "d"]))
    ids = {k: pool.get_cached_block(k) for k in "abcd"}
    # T1 only, p = 0: victims in free order, each chain's tail first
    assert pol.eviction_order() == [ids["b"], ids["a"], ids["d"], ids["c"]]


# -- lfu -----------------------------------------------------------------------------------

def test_lfu_counts_and_aging():
    pol = LFUPolicy()
    pool = BlockPool(6, BS, pol)
    for _ in range(3):
        run_one(pool, ctx(["a", "b", "c"]))  # a, b hit twice (c is never hit: the cap)
    run_one(pool, ctx(["x", "y"]))
    a, b, x = (pool.get_cached_block(k) for k in "abx")
    assert pol._freq[a] == 3 and pol._freq[x] == 1
    order = pol.eviction_order()
    assert order.index(x) < order.index(a)
    # evictions raise the age L: new blocks eventually outrank a stale frequent block
    for i in range(20):
        run_one(pool, ctx([f"n{i}", f"n{i}b", f"n{i}c", f"n{i}d"]))
    assert pool.get_cached_block("a") is None
    assert pol.age >= 3


# -- s3fifo --------------------------------------------------------------------------------

def test_s3fifo_one_hit_wonders_leave_quickly_and_ghost_promotes():
    pol = S3FIFOPolicy(small_frac=0.25)
    pool = BlockPool(8, BS, pol)
    run_one(pool, ctx(["a", "b", "c"]))
    run_one(pool, ctx(["a", "b", "c", "d"]))  # a, b hit once: promoted when S evicts
    for i in range(6):
        run_one(pool, ctx([f"s{i}"]))
    assert pool.get_cached_block("a") is not None and pool.get_cached_block("b") is not None
    assert pool.get_cached_block("s0") is None  # one-hit wonder gone
    assert "s0" in pol._ghost
    # s0 comes back: it enters M directly
    run_one(pool, ctx(["s0"]))
    assert pol._queue[pool.get_cached_block("s0")] == 1


# -- ttl -----------------------------------------------------------------------------------

def test_ttl_pins_then_lru():
    pol = TTLPolicy(ttl_s=10.0)
    pool = BlockPool(6, BS, pol)
    run_one(pool, ctx(["a", "b"], t=0.0, session="s1"))   # pinned until 10
    run_one(pool, ctx(["c", "d"], t=1.0))                 # no session: unpinned
    ids = {k: pool.get_cached_block(k) for k in "abcd"}
    assert pol.eviction_order() == [ids["d"], ids["c"], ids["b"], ids["a"]]
    run_one(pool, ctx(["e"], t=11.0))                     # a, b expired: older than c, d
    ids["e"] = pool.get_cached_block("e")
    assert pol.eviction_order() == [ids["b"], ids["a"], ids["d"], ids["c"], ids["e"]]


def test_ttl_evicts_pinned_when_nothing_else():
    pol = TTLPolicy(ttl_s=100.0)
    pool = BlockPool(4, BS, pol)
    run_one(pool, ctx(["a", "b"], t=0.0, session="s1"))
    run_one(pool, ctx(["c", "d"], t=1.0, session="s2"))
    run_one(pool, ctx(["e", "f"], t=2.0, session="s3"))  # must evict pinned a, b first
    assert pool.get_cached_block("a") is None and pool.get_cached_block("c") is not None


def test_ttl_require_tool():
    pol = TTLPolicy(ttl_s=10.0, require_tool=True)
    pool = BlockPool(6, BS, pol)
    run_one(pool, ctx(["a"], t=0.0, session="s1", tool_name="bash"))
    run_one(pool, ctx(["b"], t=1.0, session="s1"))
    a, b = pool.get_cached_block("a"), pool.get_cached_block("b")
    assert pol.eviction_order() == [b, a]


# -- infercept -----------------------------------------------------------------------------

def test_ema():
    assert ema(None, 4.0, 0.5) == 4.0
    assert ema(4.0, 2.0, 0.5) == 3.0


def test_infercept_learns_gaps_per_session_and_evicts_furthest():
    pol = InferCeptPolicy(alpha=0.5, stale_factor=100.0)
    pool = BlockPool(10, BS, pol)
    # s_fast returns after 1 s, s_slow after 20 s
    run_one(pool, ctx(["f0"], t=0.0, session="fast"))
    run_one(pool, ctx(["w0"], t=0.0, session="slow"))
    run_one(pool, ctx(["f0", "f1"], t=1.0, session="fast"))
    run_one(pool, ctx(["w0", "w1"], t=20.0, session="slow"))
    assert pol.predicted_gap_s("fast") == 1.0
    assert pol.predicted_gap_s("slow") == 20.0
    assert pol.global_gap_s == pytest.approx(0.5 * 20 + 0.5 * 1)
    run_one(pool, ctx(["f0", "f1", "f2"], t=21.0, session="fast"))  # next use ~22
    # slow's blocks (released at 20, next use ~40) go before fast's (next use ~22)
    order = pol.eviction_order()
    w1, f2 = pool.get_cached_block("w1"), pool.get_cached_block("f2")
    assert order.index(w1) < order.index(f2)
    run_one(pool, ctx(["n"], t=21.0))  # no session: predicted never: evicted first
    assert pol.eviction_order()[0] == pool.get_cached_block("n")


def test_infercept_stale_sessions_lose_protection():
    pol = InferCeptPolicy(alpha=1.0, stale_factor=2.0)
    pool = BlockPool(10, BS, pol)
    run_one(pool, ctx(["a0"], t=0.0, session="a"))
    run_one(pool, ctx(["a0", "a1"], t=1.0, session="a"))  # gap 1: predicted next 2, stale after 3
    run_one(pool, ctx(["b0"], t=2.0, session="b"))        # prior: global 1 s -> stale after 4
    run_one(pool, ctx(["b0", "b1"], t=3.5, session="b"))  # b's gap 1.5, released at 3.5
    # at 3.5, session a (released at 1) is overdue past 3: its blocks go first
    a1 = pool.get_cached_block("a1")
    assert pol.eviction_order()[0] in (a1, pool.get_cached_block("a0"))


def test_no_policy_reads_ground_truth():
    import inspect

    import anchorage.policies.arc as m1
    import anchorage.policies.infercept as m2
    import anchorage.policies.lfu as m3
    import anchorage.policies.s3fifo as m4
    import anchorage.policies.ttl as m5
    for m in (m1, m2, m3, m4, m5):
        src = inspect.getsource(m)
        code = src.split('"""', 2)[2]  # after the module docstring
        assert "agent_truth" not in code and "tool_duration" not in code, m.__name__


# -- property-based: any interleaving keeps the pool consistent ------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_op = st.one_of(
    st.tuples(st.just("req"), st.integers(0, 3), st.integers(1, 6), st.booleans(),
              st.floats(0, 5)),
    st.tuples(st.just("free"), st.integers(0, 10)),
    st.tuples(st.just("grow"), st.integers(0, 10), st.integers(1, 12)),
)


@pytest.mark.parametrize("name", BASELINES)
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_property_any_interleaving(name, ops):
    pool = BlockPool(10, BS, make_policy(name, block_size=BS))
    running, t = [], 0.0
    for i, op in enumerate(ops):
        if op[0] == "req":
            _, family, depth, sess, dt = op
            t += dt
            keys = [(family, j) for j in range(depth)]
            c = RequestContext(request_id=i, keys=keys, input_length=depth * BS, now_s=t,
                               session_id=f"s{family}" if sess else None)
            a = pool.allocate(c)
            if a is not None:
                running.append(a)
        elif op[0] == "free" and running:
            a = running.pop(op[1] % len(running))
            a.ctx.now_s = t
            pool.free(a)
        elif op[0] == "grow" and running:
            a = running[op[1] % len(running)]
            n = a.ctx.input_length + op[2]
            if pool.grow(a, n):
                pool.cache_generated_blocks(a, n)
        pool.check_invariants()
    for a in running:
        pool.free(a)
    pool.check_invariants()
    assert pool.num_free_blocks == 10


def test_priority_structures_match_a_sorted_reference():
    from anchorage.policies._lazyheap import BucketQueue, LazyHeap

    rng = random.Random(11)
    for cls in (LazyHeap, BucketQueue):
        q, ref, t = cls(), {}, 0  # ref: block -> (priority, push time)
        for _ in range(3000):
            r = rng.random()
            if r < 0.5:
                b, pri = rng.randrange(200), rng.randrange(20)
                if b in ref and cls is BucketQueue:
                    q.remove(b)
                t += 1
                q.push(b, pri)
                ref[b] = (pri, t)
            elif r < 0.75 and ref:
                b = rng.choice(sorted(ref))
                assert q.remove(b)
                del ref[b]
            elif ref:
                want = min(ref, key=lambda b: ref[b])
                assert q.pop() == want
                del ref[want]
            assert len(q) == len(ref)
        assert list(q.ordered()) == sorted(ref, key=lambda b: ref[b])
        assert len(q._heap) <= 2 * len(ref) + 300  # compaction keeps the heap bounded
