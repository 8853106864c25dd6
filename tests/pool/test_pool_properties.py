"""Property-based tests of the block-pool model under every eviction policy.

Traces are small chains of block keys with prefix sharing, branching histories, exact
resends (duplicate physical blocks) and partial last blocks; the pool runs them either
sequentially (``replay``) or interleaved (several requests allocated, decoded and freed in
random order, with failed admissions and decode steps), checking the pool's invariants
after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy, policy_names
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.replay import infinite_hit_rate, replay
from tests.pool.workload import KeyTrie

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

# one request: (history family, how much of the family's prompt to keep, new blocks,
# tokens in a partial last block, output tokens)
request_st = st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 3),
                       st.integers(0, 3), st.integers(1, 9))


@st.composite
def traces(draw, min_size=1, max_size=40):
    """(contexts, block_size): prefix-chained prompts with branching family histories."""
    bs = draw(st.sampled_from([1, 2, 4]))
    specs = draw(st.lists(request_st, min_size=min_size, max_size=max_size))
    trie = KeyTrie()
    families: dict[int, list] = {}
    contexts = []
    for i, (fam, keep, new, tail, out) in enumerate(specs):
        labels = families.get(fam, [])[:keep] + [(i, j) for j in range(new)]
        if not labels:
            labels = [(i, 0)]
        families[fam] = labels
        tail %= bs
        keys = trie.chain(labels + ([("tail", i)] if tail else []))
        contexts.append(RequestContext(
            request_id=i, keys=keys, input_length=len(labels) * bs + tail,
            output_length=out, session_id=f"s{fam}", seq=i, now_s=float(i)))
    return contexts, bs


def held_refs(running: dict) -> dict[int, int]:
    refs: dict[int, int] = {}
    for alloc in running.values():
        for b in alloc.blocks:
            refs[b] = refs.get(b, 0) + 1
    return refs


def check_accounting(pool: BlockPool, running: dict) -> None:
    """Every reference is held by a running request; nothing leaked, nothing double-freed,
    and the blocks in use plus the free ones are exactly the pool."""
    pool.check_invariants()
    refs = held_refs(running)
    for b in range(1, pool.capacity_blocks + 1):
        assert pool.ref_cnt[b] == refs.get(b, 0), f"block {b}: ref_cnt {pool.ref_cnt[b]}"
    assert len(refs) + pool.num_free_blocks == pool.capacity_blocks
    free = pool.free_queue_order()
    assert len(free) == len(set(free)) == pool.num_free_blocks
    assert not set(free) & set(refs)


def interleave(contexts, bs, capacity, policy_name, ops):
    """Admit / decode / free requests in the order ``ops`` dictates."""
    pool = BlockPool(capacity, bs, make_policy(policy_name, block_size=bs, contexts=contexts))
    pending = list(reversed(contexts))
    running: dict[int, object] = {}
    computed: dict[int, int] = {}
    seen: set = set()  # keys cached so far: the infinite cache's content
    ops = list(ops)
    k = 0
    while pending or running:
        op = ops[k % len(ops)] if ops else 0
        k += 1
        if pending and (op % 3 == 0 or not running):
            ctx = pending.pop()
            alloc = pool.allocate(ctx)
            if alloc is None:
                # refused only when it truly does not fit
                hit = pool.num_hit_blocks(ctx.keys, ctx.input_length)
                hits = [pool.get_cached_block(key) for key in ctx.keys[:hit]]
                reusable = sum(1 for b in hits if pool.ref_cnt[b] == 0)
                need = pool.blocks_needed(ctx.input_length) - hit
                assert need > pool.num_free_blocks - reusable
                if running:
                    pending.append(ctx)
                    victim = sorted(running)[op % len(running)]
                    pool.free(running.pop(victim))
                    del computed[victim]
            else:
                limit = min(len(ctx.keys), (ctx.input_length - 1) // bs)
                inf = 0
                while inf < limit and ctx.keys[inf] in seen:
                    inf += 1
                assert alloc.hit_blocks <= inf, "hit beyond the infinite-cache bound"
                seen.update(ctx.keys[: ctx.input_length // bs])
                running[ctx.request_id] = alloc
                computed[ctx.request_id] = ctx.input_length
        else:
            rid = sorted(running)[op % len(running)]
            alloc = running[rid]
            target = alloc.ctx.input_length + alloc.ctx.output_length - 1
            if computed[rid] < target and op % 5 != 4:
                n = 1 if op % 2 else target - computed[rid]
                if pool.grow(alloc, computed[rid] + n):
                    computed[rid] += n
                    pool.cache_generated_blocks(alloc, computed[rid])
                else:
                    pool.free(running.pop(rid))
                    del computed[rid]
            else:
                pool.free(running.pop(rid))
                del computed[rid]
        check_accounting(pool, running)
    assert pool.num_free_blocks == capacity
    assert all(r == 0 for r in pool.ref_cnt)
    return pool


@SETTINGS
@given(traces(), st.integers(1, 30), st.lists(st.integers(0, 1000), max_size=60),
       st.sampled_from(["lru", "belady"]))
def test_interleaved_no_leaks(trace, capacity, ops, policy):
    contexts, bs = trace
    interleave(contexts, bs, capacity, policy, ops)


@pytest.mark.parametrize("policy", [n for n in policy_names() if n not in ("lru", "belady")])
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), capacity=st.integers(1, 30),
       ops=st.lists(st.integers(0, 1000), max_size=60))
def test_interleaved_no_leaks_other_policies(policy, trace, capacity, ops):
    """Every registered policy keeps the pool's mechanics intact."""
    contexts, bs = trace
    interleave(contexts, bs, capacity, policy, ops)


def replay_hits(contexts, bs, capacity, name, include_output=True):
    pol = make_policy(name, block_size=bs, contexts=contexts)
    return replay(contexts, capacity, bs, pol, include_output=include_output, check_every=1)


@SETTINGS
@given(traces(), st.integers(1, 40), st.booleans())
def test_sequential_bounds(trace, capacity, include_output):
    """Hits never exceed the infinite cache; Belady never loses to LRU."""
    contexts, bs = trace
    inf = infinite_hit_rate(contexts, bs)
    lru = replay_hits(contexts, bs, capacity, "lru", include_output)
    bel = replay_hits(contexts, bs, capacity, "belady", include_output)
    for r in (lru, bel):
        assert r.hit_rate <= inf + 1e-12
        assert r.hit_blocks <= r.prompt_blocks
    assert bel.hit_blocks >= lru.hit_blocks, (bel.hit_blocks, lru.hit_blocks)


@SETTINGS
@given(traces(min_size=2), st.integers(1, 40))
def test_reset_prefix_cache(trace, capacity):
    contexts, bs = trace
    pool = BlockPool(capacity, bs, make_policy("lru"))
    first = contexts[0]
    if pool.blocks_needed(first.input_length) > capacity:
        return
    alloc = pool.allocate(first)
    assert not pool.reset_prefix_cache(), "reset must refuse while blocks are in use"
    pool.free(alloc)
    before = pool.free_queue_order()
    assert pool.reset_prefix_cache()
    pool.check_invariants()
    assert pool.free_queue_order() == before, "reset keeps queue positions"
    assert not pool.cached and pool.num_cached_free_blocks == 0
    again = pool.allocate(first)
    assert again.hit_blocks == 0
    pool.free(again)
    pool.check_invariants()
