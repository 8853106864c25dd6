from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.tiering.eviction import TieredEviction


def ctx(rid, keys, agent, now=0.0):
    return RequestContext(request_id=rid, keys=keys, input_length=len(keys) * 4 + 1,
                          now_s=now, session_id=f"s{rid}", agent_hint=agent)


def pool_with(policy="lru", cap=12):
    pol = TieredEviction(make_policy(policy, block_size=4), lambda c: c.agent_hint)
    return BlockPool(cap, 4, pol), pol


def run(pool, c):
    a = pool.allocate(c, c.input_length)
    assert a is not None
    pool.free(a)
    return a


def test_demoted_blocks_are_evicted_first():
    for name in ("lru", "hybrid"):
        pool, pol = pool_with(name)
        a = run(pool, ctx(1, ["a1", "a2", "a3"], "x", 0.0))
        run(pool, ctx(2, ["b1", "b2", "b3"], "y", 1.0))
        run(pool, ctx(3, ["c1", "c2", "c3"], "y", 2.0))
        pool.check_invariants()
        # b's blocks were freed after a's: LRU would evict a first; demote b
        b_blocks = [pool.get_cached_block(k) for k in ["b1", "b2", "b3"]]
        assert pol.demote(b_blocks) == 3
        pool.check_invariants()
        assert list(pol.eviction_order())[:3] == b_blocks
        run(pool, ctx(4, ["d1", "d2", "d3", "d4", "d5"], "z", 3.0))
        pool.check_invariants()
        assert all(pool.get_cached_block(k) is None for k in ["b1", "b2", "b3"])
        assert pool.get_cached_block("a1") is not None, name
        assert pol.demoted_evictions == 3
        assert a.ctx.agent_hint == "x"


def test_reserved_blocks_are_protected_from_other_agents():
    pool, pol = pool_with("lru", cap=12)
    pol.set_reservation({"crit": 3})
    run(pool, ctx(1, ["k1", "k2", "k3"], "crit", 0.0))   # protected (share 3)
    run(pool, ctx(2, ["o1", "o2", "o3"], "other", 1.0))
    pool.check_invariants()
    assert pol.reserved_free() == {"crit": 3}
    # another agent needs 9 blocks: 6 uncached free, 3 evicted: all of "other", none of k
    run(pool, ctx(3, ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"], "other", 2.0))
    pool.check_invariants()
    assert all(pool.get_cached_block(k) is not None for k in ["k1", "k2", "k3"])
    assert pool.get_cached_block("o1") is None
    # a hit on a protected block takes it out of the reserve
    run(pool, ctx(4, ["k1", "k2", "k3", "k4"], "crit", 3.0))
    pool.check_invariants()
    # shrinking the share hands the blocks back to the wrapped policy
    pol.set_reservation({"crit": 1}, now=4.0)
    pool.check_invariants()
    assert sum(pol.reserved_free().values()) <= 1


def test_protected_blocks_go_when_nothing_else_is_left():
    pool, pol = pool_with("lru", cap=4)
    pol.set_reservation({"crit": 4})
    run(pool, ctx(1, ["k1", "k2", "k3"], "crit", 0.0))
    run(pool, ctx(2, ["o1", "o2", "o3"], "other", 1.0))  # must evict protected blocks
    pool.check_invariants()
    assert pol.protected_evictions >= 2


def blocks_of(pool, keys):
    return [pool.get_cached_block(k) for k in keys]


def test_demoted_blocks_go_furthest_predicted_reuse_first():
    pool, pol = pool_with("lru", cap=12)
    run(pool, ctx(1, ["a1", "a2"], "x", 0.0))
    run(pool, ctx(2, ["b1", "b2"], "y", 1.0))
    run(pool, ctx(3, ["c1", "c2"], "z", 2.0))
    a, b, c = (blocks_of(pool, [p + "1", p + "2"]) for p in "abc")
    assert pol.demote(reversed(a), reuse_s=50.0) == 2
    assert pol.demote(reversed(b), reuse_s=90.0) == 2
    assert pol.demote(reversed(c), reuse_s=10.0) == 2
    pool.check_invariants()
    # b is back last, so it goes first; within a chain the tail goes first
    assert list(pol.eviction_order())[:6] == b[::-1] + a[::-1] + c[::-1]
    # re-keying: c's request is now expected later than everyone
    pol.demote(reversed(c), reuse_s=200.0)
    assert list(pol.eviction_order())[:2] == c[::-1]
    run(pool, ctx(4, ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"], "w", 3.0))
    pool.check_invariants()
    assert all(pool.get_cached_block(k) is None for k in ["c1", "c2"])
    assert pool.get_cached_block("b1") is not None


def test_held_blocks_outlive_the_wrapped_policy_until_released():
    pool, pol = pool_with("lru", cap=8)
    run(pool, ctx(1, ["h1", "h2", "h3"], "x", 0.0))   # a short stall: held
    run(pool, ctx(2, ["o1", "o2", "o3"], "y", 1.0))
    held = blocks_of(pool, ["h1", "h2", "h3"])
    assert pol.hold(reversed(held), until_s=5.0) == 3
    pool.check_invariants()
    # LRU would evict h first; held blocks go after the wrapped policy's
    assert set(list(pol.eviction_order())[-3:]) == set(held)
    run(pool, ctx(3, ["n1", "n2", "n3", "n4"], "z", 2.0))  # 2 uncached + 2 evicted
    pool.check_invariants()
    assert all(pool.get_cached_block(k) is not None for k in ["h1", "h2", "h3"])
    assert pool.get_cached_block("o1") is None
    assert pol.release(4.9) == 0
    # past the deadline they are ordinary blocks again (freed at 5 s: LRU's newest)
    assert pol.release(5.0) == 3 and not pol.held
    pool.check_invariants()
    assert set(pol.eviction_order()) >= set(held)
    # a hit takes a held block out, the rest are still evicted last
    pool2, pol2 = pool_with("lru", cap=8)
    run(pool2, ctx(1, ["h1", "h2"], "x", 0.0))
    pol2.hold(reversed(blocks_of(pool2, ["h1", "h2"])), until_s=9.0)
    run(pool2, ctx(2, ["h1", "h2", "h3"], "x", 1.0))
    pool2.check_invariants()
    assert not pol2.held


def test_held_blocks_are_evicted_when_nothing_else_is_left():
    pool, pol = pool_with("lru", cap=4)
    run(pool, ctx(1, ["h1", "h2", "h3"], "x", 0.0))
    pol.hold(blocks_of(pool, ["h1", "h2", "h3"]), until_s=100.0)
    run(pool, ctx(2, ["o1", "o2", "o3"], "y", 1.0))  # 4 blocks: 1 uncached + 3 held
    pool.check_invariants()
    assert pol.held_evictions == 3 and not pol.held


def test_the_reserve_keeps_the_agents_newest_blocks():
    pool, pol = pool_with("lru", cap=12)
    pol.set_reservation({"crit": 2})
    run(pool, ctx(1, ["k1", "k2", "k3"], "crit", 0.0))
    # a chain is freed tail first: the share keeps its head (what a prefix hit needs)
    assert set(pol.protected["crit"]) == set(blocks_of(pool, ["k1", "k2"]))
    run(pool, ctx(2, ["m1", "m2"], "crit", 1.0))
    pool.check_invariants()
    # a newer turn of the agent displaces the older protected blocks
    assert set(pol.protected["crit"]) == set(blocks_of(pool, ["m1", "m2"]))
    assert pol.reserved_free() == {"crit": 2}


def test_holding_leaves_reserved_blocks_reserved():
    pool, pol = pool_with("lru", cap=12)
    pol.set_reservation({"crit": 2})
    run(pool, ctx(1, ["k1", "k2", "k3"], "crit", 0.0))
    ks = blocks_of(pool, ["k1", "k2", "k3"])
    assert pol.hold(reversed(ks), until_s=5.0) == 1  # k3; k1, k2 are reserved
    pool.check_invariants()
    assert set(pol.held) == {ks[2]} and pol.reserved_free() == {"crit": 2}
