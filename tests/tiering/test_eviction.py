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
