"""Notifications about blocks a policy never saw assigned (found running vLLM's upstream
KV-cache tests with the plugin on): a hit on a free block the policy does not hold, and
blocks freed that the policy never saw cached or requested (vLLM's ``allocate_slots``
without a prior ``get_computed_blocks``, its connector path). No policy may raise; the
blocks stay evictable and leave in a sensible order."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy, policy_names
from anchorage.pool.block_pool import BlockPool
from tests.policies.test_baselines import random_contexts
from tests.policies.test_hybrid import _no_signal_trace, lockstep_pools

ONLINE = policy_names(include_offline=False)
BS = 4


def _anon(t: float = 0.0) -> RequestContext:
    return RequestContext(request_id=None, keys=(), input_length=0, now_s=t, warmup=True)


class BlindPool(BlockPool):
    """A pool whose policy does not hear of some requests (``blind(ctx)``): no
    ``on_request``, and with ``uncached`` no ``on_cached`` either; it still hears of their
    hits, frees and evictions, as the vLLM plugin does on the connector path."""

    def __init__(self, cap: int, bs: int, policy, blind, uncached: bool = False):
        super().__init__(cap, bs, policy)
        on_request, on_cached = policy.on_request, policy.on_cached
        policy.on_request = lambda c: None if blind(c) else on_request(c)
        if uncached:
            policy.on_cached = lambda c, *a: None if blind(c) else on_cached(c, *a)


@pytest.mark.parametrize("name", ONLINE)
def test_a_hit_on_a_free_block_never_seen_is_ignored(name):
    pol = make_policy(name, block_size=BS)
    pool = BlockPool(8, BS, pol)
    c = RequestContext(request_id=1, keys=["a", "b"], input_length=2 * BS, now_s=1.0)
    pool.free(pool.allocate(c))
    order = list(pol.eviction_order())
    pol.on_hit(_anon(), [7], [7])  # block 7 is not cached: the policy never saw it
    assert list(pol.eviction_order()) == order


@pytest.mark.parametrize("name", ONLINE)
def test_blocks_freed_without_being_seen_are_evictable(name):
    pol = make_policy(name, block_size=BS)
    BlockPool(8, BS, pol)
    pol.on_freed(_anon(1.0), [3, 2, 1])  # tail first, as vLLM frees
    assert sorted(pol.eviction_order()) == [1, 2, 3]
    got = [pol.pop_victim() for _ in range(3)]
    assert sorted(got) == [1, 2, 3]
    assert pol.pop_victim() is None
    for b in got:
        pol.on_evicted(b, ("k", b))


@pytest.mark.parametrize("name", ONLINE)
@pytest.mark.parametrize("uncached", [False, True])
def test_blind_requests_keep_every_invariant(name, uncached):
    ctxs = random_contexts(3, n=300)
    pol = make_policy(name, block_size=BS)
    pool = BlindPool(120, BS, pol, lambda c: c.seq % 3 == 0, uncached)
    for i, c in enumerate(ctxs):
        total = c.input_length + c.output_length
        if pool.blocks_needed(total) > pool.capacity_blocks:
            continue
        a = pool.allocate(c)
        assert a is not None  # sequential: every block is free between requests
        assert pool.grow(a, total)
        pool.cache_generated_blocks(a, total)
        pool.free(a)
        if i % 10 == 0:
            pool.check_invariants()
    assert pool.stats.evictions > 0


def test_hybrid_orders_unseen_blocks_by_recency_among_the_rest():
    pol = make_policy("hybrid", block_size=BS)
    pool = BlockPool(16, BS, pol)
    pool.free(pool.allocate(RequestContext(request_id=1, keys=["a1", "a2"],
                                           input_length=2 * BS + 1, now_s=1.0,
                                           session_id="s")))
    known = list(pol.eviction_order())
    pol.on_freed(_anon(2.0), [9, 8])  # freed later, never seen: after the known ones
    assert list(pol.eviction_order()) == known + [9, 8]
    pol.on_hit(_anon(3.0), [9], [9])  # a hit takes it out, like any free block
    assert list(pol.eviction_order()) == known + [8]


def test_hybrid_without_signal_is_lru_with_blind_requests():
    # the anonymous group is a recency group: interleaved with the others exactly as LRU
    ctxs = _no_signal_trace(4, 200)

    def blind(c):
        return c.seq % 3 == 1

    for cap in (40, 90):
        lru, hyb = make_policy("lru"), make_policy("hybrid")
        _, pb = lockstep_pools(ctxs, BlindPool(cap, 16, lru, blind),
                               BlindPool(cap, 16, hyb, blind))
        assert pb.stats.evictions > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cap=st.integers(30, 120), every=st.integers(2, 5))
def test_blind_requests_property(seed, cap, every):
    ctxs = _no_signal_trace(seed, 100)
    lru, hyb = make_policy("lru"), make_policy("hybrid")

    def blind(c):
        return c.seq % every == 0

    _, pb = lockstep_pools(ctxs, BlindPool(cap, 16, lru, blind), BlindPool(cap, 16, hyb, blind))
    pb.check_invariants()
