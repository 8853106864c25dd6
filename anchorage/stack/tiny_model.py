"""A tiny Llama model directory (``config.json`` only) that vLLM serves with dummy weights
(``--load-format dummy --skip-tokenizer-init``): prompts are token ids in ``[0, VOCAB)``.
Used when ``anchorage up`` is given no model path; real enough to exercise vLLM's
scheduler, prefix cache and KV events on a CPU in milliseconds per request."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 1024
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 32, "vocab_size": VOCAB,
              "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
              "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
              "tie_word_embeddings": False}


def write_tiny_model(directory: str | Path) -> Path:
    """Write the config into ``directory`` (created) and return it."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(TINY_LLAMA, indent=1))
    return d


def vocab_size(model_dir: str | Path) -> int:
    """The model's vocabulary size from its config.json (token ids must stay below it)."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return VOCAB
