"""Tiny Llama model directories that vLLM serves with dummy weights, on a CPU, in
milliseconds per request; real enough to exercise vLLM's scheduler, prefix cache and KV
events. Two flavours:

- ``write_tiny_model(dir)`` (``config.json`` only): served with ``--load-format dummy
  --skip-tokenizer-init``; prompts are token ids in ``[0, VOCAB)``. What ``anchorage up``
  starts when given no model path, and what the token-id tests use.
- ``write_tiny_chat_model(dir)`` (flavour ``chat``): the same network plus a real
  tokenizer built here, offline, with ``tokenizers``: byte-level BPE trained on a fixed
  corpus (``CORPUS``; deterministic), the special tokens ``<s>``, ``</s>``, ``<unk>`` and
  the chat role markers, a ``<s>`` added to text prompts, and a Jinja chat template
  (``CHAT_TEMPLATE``). Its ``vocab_size`` in ``config.json`` is the tokenizer's, padded
  to a multiple of 64. vLLM serves it without ``--skip-tokenizer-init``, so text and chat
  requests work, and ``anchorage router --tokenizer DIR`` keys them by the same tokens.

Two sizes of the network (``SIZES``; ``size=`` of every writer):

- ``tiny`` (default): hidden 128, MLP 256, 4 heads. A prompt's prefill costs less than
  the serving path around it (HTTP, tokenizing, vLLM's per-step work), so TTFT on it
  measures that path more than the KV cache.
- ``small``: hidden 256, MLP 1,024, 8 heads (KV heads too): about 6x the work per token,
  and twice the KV bytes per token. Prefill is then most of a TTFT on a CPU, as it is on
  a GPU serving a real model, so a prefix the cache holds shows in TTFT.
"""

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
FLAVOURS = ("ids", "chat")
SIZES = {"tiny": {},
         "small": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8,
                   "num_key_value_heads": 8}}


def model_config(size: str = "tiny") -> dict:
    """``config.json`` of the network of this size (``SIZES``)."""
    if size not in SIZES:
        raise ValueError(f"tiny model size must be one of {', '.join(SIZES)}, not {size!r}")
    return {**TINY_LLAMA, **SIZES[size]}

SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
_WORDS = ("the of and to in is you that it for are as with on be this have from or one "
          "had by word but not what all were we when your can said there use an each which "
          "she do how their if will up other about out many then them these so some her "
          "would make like him into time has look two more write go see number no way could "
          "people my than first water been call who oil its now find long down day did get "
          "come made may part agent tool call result plan step task file code test review "
          "search answer question system user assistant reply function argument error value "
          "list read edit run build check summary report data model cache prefix session")
CORPUS = "\n".join(
    [_WORDS, _WORDS.upper(), _WORDS.title(), "0 1 2 3 4 5 6 7 8 9 10 100 2024 3.14 -1",
     "You are a helpful agent. Answer the question. Use the tools when needed.",
     "{ } [ ] ( ) < > : ; , . ! ? ' \" / \\ | _ - + = * & ^ % $ # @ ~ `"]
    + [" ".join(_WORDS.split()[i::7]) for i in range(7)])


def write_tiny_model(directory: str | Path, size: str = "tiny") -> Path:
    """Write the config into ``directory`` (created) and return it."""
    cfg = model_config(size)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def build_tokenizer(vocab_size: int = 960):
    """The chat flavour's tokenizer (``tokenizers.Tokenizer``), trained on ``CORPUS``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return tok


def write_tiny_chat_model(directory: str | Path, size: str = "tiny") -> Path:
    """The chat flavour (module docstring) in ``directory``; returns it."""
    base = model_config(size)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(d / "tokenizer.json"))
    n = tok.get_vocab_size()
    ids = {t: tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>")}
    cfg = dict(base, vocab_size=-(-n // 64) * 64, bos_token_id=ids["<s>"],
               eos_token_id=ids["</s>"])
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "add_bos_token": True,
        "model_max_length": TINY_LLAMA["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}, indent=1))
    (d / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}))
    (d / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}))
    return d


def write_model(directory: str | Path, flavour: str = "ids", size: str = "tiny") -> Path:
    if flavour not in FLAVOURS:
        raise ValueError(f"tiny model flavour must be one of {', '.join(FLAVOURS)}, not {flavour!r}")
    if flavour == "chat":
        return write_tiny_chat_model(directory, size)
    return write_tiny_model(directory, size)


def has_tokenizer(model_dir: str | Path) -> bool:
    return (Path(model_dir) / "tokenizer.json").is_file() or \
        (Path(model_dir) / "tokenizer_config.json").is_file()


def vocab_size(model_dir: str | Path) -> int:
    """The model's vocabulary size from its config.json (token ids must stay below it)."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return VOCAB
