"""Unit tests of the `lru` and `belady` policies, alone and inside the pool."""

from __future__ import annotations

import math

from anchorage.policies.base import RequestContext
from anchorage.policies.belady import next_use_table
from anchorage.policies.lru import LRUPolicy
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import replay

INF = math.inf
BS = 4


def ctx(i, keys, n_tokens=None, out=0):
    return RequestContext(request_id=i, keys=keys,
                          input_length=len(keys) * BS + 1 if n_tokens is None else n_tokens,
                          output_length=out, seq=i)


# -- lru ------------------------------------------------------------------------------------

def test_lru_queue_order():
    p = LRUPolicy()
    c = ctx(0, [])
    p.on_freed(c, [3, 2, 1])
    p.on_freed(c, [7])
    assert list(p.eviction_order()) == [3, 2, 1, 7]
    p.on_hit(c, [2, 9], were_free=[2])  # 9 was in use: not in the queue
    assert list(p.eviction_order()) == [3, 1, 7]
    assert p.pop_victim() == 3
    assert p.pop_victim() == 1
    p.reset()
    assert p.pop_victim() is None and list(p.eviction_order()) == []


def test_lru_in_pool_tail_first_uncached_first():
    pool = BlockPool(8, BS, LRUPolicy())
    a = pool.allocate(ctx(0, ["a0", "a1", "a2"], n_tokens=3 * BS + 2))  # 3 full + partial
    assert a.blocks == [1, 2, 3, 4] and a.num_cached == 3
    pool.free(a)
    # the uncached partial block goes to the head; cached ones to the tail, tail first
    assert pool.free_queue_order() == [4, 5, 6, 7, 8, 3, 2, 1]
    b = pool.allocate(ctx(1, ["a0", "b1"]))  # hits a0 (block 1): it leaves the queue
    assert b.hit_blocks == 1 and b.blocks == [1, 4, 5]
    assert pool.free_queue_order() == [6, 7, 8, 3, 2]
    pool.free(b)
    assert pool.free_queue_order() == [5, 6, 7, 8, 3, 2, 4, 1]
    pool.check_invariants()


def test_lru_evicts_least_recently_freed():
    pool = BlockPool(4, BS, LRUPolicy())
    for i, k in enumerate(["x", "y", "z", "w"]):
        pool.free(pool.allocate(ctx(i, [k], BS)))  # one full block each, all cached
    x = pool.allocate(ctx(4, ["x"], BS + 1))  # hits x, needs one more block
    assert x.hit_blocks == 1
    assert pool.get_cached_block("y") is None  # y was freed earliest (x was hit): evicted
    assert pool.stats.evictions == 1
    pool.free(x)
    pool.check_invariants()


def test_full_hit_is_capped_one_block_short_and_duplicated():
    pool = BlockPool(8, BS, LRUPolicy())
    pool.free(pool.allocate(ctx(0, ["p0", "p1"], n_tokens=2 * BS)))
    again = pool.allocate(ctx(1, ["p0", "p1"], n_tokens=2 * BS))
    assert again.hit_blocks == 1  # the last token must be recomputed: one block short
    assert again.blocks[0] == 1 and again.blocks[1] != 2
    assert pool.get_cached_block("p1") == 2  # lookups keep the first copy
    pool.free(again)
    pool.check_invariants()


# -- belady ---------------------------------------------------------------------------------

def test_next_use_table_respects_hit_limits():
    keys = [["a", "b"], ["a"], ["a", "b", "c"], ["b"]]
    limits = [1, 0, 2, 1]
    t = next_use_table(keys, limits)
    assert t[3] == [INF]
    assert t[2] == [INF, 3, INF]
    assert t[1] == [2]  # request 1 cannot hit "a" (limit 0), request 2 can
    assert t[0] == [2, 2]


def test_belady_evicts_furthest_next_use():
    # capacity 2: after a and b, c needs a block; a is used again at 3, b at 4 -> evict b
    cs = [ctx(0, ["a"], BS), ctx(1, ["b"], BS), ctx(2, ["c"], BS),
          ctx(3, ["a"], BS + 1), ctx(4, ["b"], BS + 1)]
    bel = replay(cs, 2, BS, make_policy("belady", block_size=BS, contexts=cs),
                 include_output=False, check_every=1)
    lru = replay(cs, 2, BS, make_policy("lru"), include_output=False)
    assert bel.hit_blocks == 1 and lru.hit_blocks == 0


def test_belady_ties_deeper_first():
    cs = [ctx(0, ["r0", "r1"], 2 * BS + 1)]
    pol = make_policy("belady", block_size=BS, contexts=cs)
    pool = BlockPool(4, BS, pol)
    pool.free(pool.allocate(cs[0]))  # blocks 1 (r0), 2 (r1): never used again
    assert list(pol.eviction_order()) == [2, 1]


def test_belady_duplicate_copy_goes_first():
    cs = [ctx(0, ["r0", "r1"], 2 * BS), ctx(1, ["r0", "r1"], 2 * BS),
          ctx(2, ["r0", "r1"], 2 * BS + 1)]
    pol = make_policy("belady", block_size=BS, contexts=cs)
    pool = BlockPool(4, BS, pol)
    pool.free(pool.allocate(cs[0]))
    second = pool.allocate(cs[1])  # hits r0, recomputes r1 into a duplicate (block 3)
    assert second.blocks == [1, 3]
    pool.free(second)
    assert pool.get_cached_block("r1") == 2
    # r1's duplicate is never hit while block 2 is cached; then the deeper block first
    assert list(pol.eviction_order()) == [3, 2, 1]
    pool.check_invariants()


def test_belady_ignores_requests_that_cannot_fit():
    # request 2 needs 3 blocks in a 2-block pool: it never runs, so it is no use of "a"
    cs = [ctx(0, ["a"], BS), ctx(1, ["b"], BS), ctx(2, ["a", "x", "y"], 3 * BS),
          ctx(3, ["b"], BS + 1)]
    res = replay(cs, 2, BS, make_policy("belady", block_size=BS, contexts=cs),
                 include_output=False, check_every=1)
    assert res.oversize == 1 and res.hit_blocks == 1
    pol = make_policy("belady", block_size=BS, contexts=cs)
    pool = BlockPool(2, BS, pol)
    for c in cs[:2]:
        pool.free(pool.allocate(c))
    assert list(pol.eviction_order()) == [1, 2]  # a (block 1) is never used: first


def test_belady_next_use_refreshed_when_the_key_is_requested():
    # P is next used by request 2, Q by request 3; once request 2 has arrived (hit or
    # not), P is never used again and must go first: no stale "soon" next use
    cs = [ctx(0, ["P"], BS), ctx(1, ["Q"], BS), ctx(2, ["P"], BS + 1), ctx(3, ["Q"], BS + 1)]
    pol = make_policy("belady", block_size=BS, contexts=cs)
    pool = BlockPool(2, BS, pol)
    for c in cs[:2]:
        pool.free(pool.allocate(c))
    assert list(pol.eviction_order()) == [2, 1]
    pol.on_request(cs[2])
    assert list(pol.eviction_order()) == [1, 2]


def test_subclass_overriding_pop_victim_is_not_bypassed():
    class MRU(LRUPolicy):
        name = "mru"

        def pop_victim(self):
            return self._queue.popitem(last=True)[0] if self._queue else None

    pool = BlockPool(3, BS, MRU())
    for i, k in enumerate(["x", "y", "z"]):
        pool.free(pool.allocate(ctx(i, [k], BS)))
    pool.allocate(ctx(3, ["w"], BS))
    assert pool.get_cached_block("z") is None  # most recently freed goes first
    assert pool.get_cached_block("x") == 1
