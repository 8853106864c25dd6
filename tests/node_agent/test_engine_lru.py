"""The plugin inside the real engine: ``ANCHORAGE_POLICY=lru`` hits exactly what stock does.

One randomized agent-like token-id trace (shared anchors, session histories, resends,
partial last blocks) runs twice through the same in-process engine, in batches so that
several requests are in flight and the 39-block pool evicts: once with the pool driven
by the ``lru`` policy (attached by the plugin's entry point when the engine was built),
once stock (driver detached), with ``reset_prefix_cache`` in between. Per-request
``num_cached_tokens`` must be identical, and the policy must have chosen the victims.
A policy that raises on every decision keeps the engine serving, stock, and is counted.
"""

from __future__ import annotations

import random

from anchorage.node_agent import vllm_block_pool
from tests.pool.workload import agent_workload, token_blocks

BATCH = 6


def make_trace(bs: int, max_len: int, n: int = 48, seed: int = 3):
    rng = random.Random(seed)
    tokens_of = token_blocks(rng, bs)
    out = []
    for r in agent_workload(rng, bs, n, n_agents=3, n_sessions=3, max_output_blocks=1):
        max_tokens = rng.randint(1, 6)
        keys = r.keys[: (max_len - max_tokens) // bs - 1]  # fits: a truncated prefix
        prompt_len = min(r.prompt_len, len(keys) * bs)
        toks = [t % 1000 + 3 for t in tokens_of(keys, prompt_len)]  # vocab 1024
        out.append((toks, max_tokens))
    return out


def run(engine, trace) -> list[int]:
    llm, SP, TP = engine.llm, engine.SamplingParams, engine.TokensPrompt
    hits = []
    for i in range(0, len(trace), BATCH):
        chunk = trace[i:i + BATCH]
        prompts = [TP(prompt_token_ids=t) for t, _ in chunk]
        params = [SP(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in chunk]
        outs = llm.generate(prompts, params, use_tqdm=False)
        hits += [o.num_cached_tokens for o in outs]
    return hits


def test_lru_policy_in_the_engine_hits_like_stock(engine):
    trace = make_trace(engine.block_size, engine.max_model_len)
    driver = vllm_block_pool.driver(engine.pool)
    assert driver is not None and driver.policy.name == "lru", "the entry point did not attach"

    assert engine.llm.reset_prefix_cache()
    victims0, errors0 = vllm_block_pool.STATS.victims, vllm_block_pool.STATS.errors
    with_policy = run(engine, trace)
    victims = vllm_block_pool.STATS.victims - victims0
    assert vllm_block_pool.STATS.errors == errors0

    vllm_block_pool.detach(engine.pool)
    try:
        assert engine.llm.reset_prefix_cache()
        stock = run(engine, trace)
    finally:
        assert engine.llm.reset_prefix_cache()
        vllm_block_pool.attach(engine.pool, driver.policy.__class__())

    assert with_policy == stock
    assert sum(stock) > 0, "the trace never hit the prefix cache"
    assert victims > 0, "no eviction went through the policy"


def test_policy_errors_in_the_engine_keep_serving(engine):
    from anchorage.policies.lru import LRUPolicy

    class Raising(LRUPolicy):
        name = "raising"

        def pop_victim(self):
            raise RuntimeError("injected policy failure")

    trace = make_trace(engine.block_size, engine.max_model_len, n=30, seed=5)
    driver = vllm_block_pool.driver(engine.pool)
    try:
        vllm_block_pool.detach(engine.pool)
        assert engine.llm.reset_prefix_cache()
        stock = run(engine, trace)
        assert engine.llm.reset_prefix_cache()
        raising = vllm_block_pool.attach(engine.pool, Raising())
        errors0 = vllm_block_pool.STATS.errors
        hits = run(engine, trace)  # every request completes
    finally:
        assert engine.llm.reset_prefix_cache()
        vllm_block_pool.attach(engine.pool, driver.policy.__class__())
    assert len(hits) == len(trace)
    assert raising.errors > 0 and vllm_block_pool.STATS.errors - errors0 == raising.errors
    assert hits == stock  # each failed decision was stock LRU
