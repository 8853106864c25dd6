"""The tiny model's flavours: token ids only (no tokenizer), or ``chat`` with a tokenizer and
chat template built offline; and the drive's text/chat prompts."""

from __future__ import annotations

import json

import pytest

from anchorage.drive.plan import PlanOptions, plan
from anchorage.stack.tiny_model import (TINY_LLAMA, has_tokenizer, vocab_size, write_model,
                                        write_tiny_chat_model)
from anchorage.trace.format import TraceRecord


def test_the_ids_flavour_has_no_tokenizer(tmp_path):
    d = write_model(tmp_path / "m")
    assert not has_tokenizer(d) and vocab_size(d) == TINY_LLAMA["vocab_size"]
    with pytest.raises(ValueError, match="flavour"):
        write_model(tmp_path / "x", "gguf")


def test_the_small_size_is_the_same_llama_wider_in_both_flavours(tmp_path):
    from anchorage.stack.tiny_model import SIZES, model_config

    small = json.loads((write_model(tmp_path / "s", "ids", "small") / "config.json").read_text())
    assert small == model_config("small") and small["hidden_size"] == 2 * TINY_LLAMA["hidden_size"]
    assert small["intermediate_size"] == 4 * TINY_LLAMA["intermediate_size"]
    assert small["num_key_value_heads"] == small["num_attention_heads"] == 8
    assert {k: v for k, v in small.items() if k not in SIZES["small"]} == \
        {k: v for k, v in TINY_LLAMA.items() if k not in SIZES["small"]}
    with pytest.raises(ValueError, match="size must be one of tiny, small"):
        write_model(tmp_path / "x", "ids", "huge")
    pytest.importorskip("tokenizers")
    chat = json.loads((write_model(tmp_path / "c", "chat", "small") / "config.json").read_text())
    assert chat["hidden_size"] == 256 and chat["vocab_size"] != small["vocab_size"]


def test_the_chat_flavour_is_deterministic_and_its_vocab_matches_the_config(tmp_path):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    a, b = write_tiny_chat_model(tmp_path / "a"), write_tiny_chat_model(tmp_path / "b")
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    tok = transformers.AutoTokenizer.from_pretrained(str(a), local_files_only=True)
    cfg = json.loads((a / "config.json").read_text())
    assert len(tok) <= cfg["vocab_size"] < len(tok) + 64
    assert cfg["bos_token_id"] == tok.bos_token_id and cfg["eos_token_id"] == tok.eos_token_id
    msgs = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Run the test and report the error"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<s><|system|>\nYou are") and text.endswith("<|assistant|>\n")
    # what vLLM does (render, then tokenize without adding special tokens) is what the
    # router's tokenizer computes
    from anchorage.router.keys import ChatTokenizer
    ours = ChatTokenizer(str(a))
    assert ours.encode_chat(msgs) == tok(text, add_special_tokens=False)["input_ids"]
    assert ours.encode_text("hello agent")[0] == tok.bos_token_id
    assert tok.decode(tok("file code test", add_special_tokens=False)["input_ids"]) == "file code test"


def test_chat_prompts_keep_the_traces_sharing():
    recs = [TraceRecord(timestamp=0, hash_ids=[1, 2, 3], input_length=96, output_length=4,
                        session_id="s"),
            TraceRecord(timestamp=10, hash_ids=[1, 2, 4], input_length=96, output_length=4,
                        session_id="t")]
    reqs = [r for sp in plan(recs, PlanOptions(block_size=32, prompt_format="chat"))
            for r in sp.requests]
    assert {r.path for r in reqs} == {"/v1/chat/completions"}
    a, b = (r.body["messages"][0]["content"].split() for r in reqs)
    assert a[:48] == b[:48] and a != b                  # two shared blocks of 24 words
    with pytest.raises(ValueError, match="prompt format"):
        PlanOptions(prompt_format="xml")


def test_text_prompts_measured_by_a_tokenizer_take_the_fewest_blocks_that_reach_the_length(tmp_path):
    """``TextBlocks.prompt`` finds the block count by bisection; it must equal adding
    blocks one by one until the text is long enough, then cutting it to the length."""
    pytest.importorskip("tokenizers")
    from anchorage.drive.plan import TextBlocks
    d = write_model(tmp_path / "m", "chat")
    tb = TextBlocks(32, seed=3, tokenizer=str(d))

    def reference(rec, limit):
        text, target = "", min(rec.input_length, limit)
        for bid in rec.hash_ids:
            if tb._length(text) >= target:
                break
            text += tb.block("", bid)
        return tb._cut(text, target)

    for n, length, limit in ((1, 20, 4000), (5, 150, 4000), (12, 330, 4000), (12, 330, 100),
                             (3, 1000, 4000)):
        rec = TraceRecord(timestamp=0, hash_ids=list(range(n)), input_length=length,
                          output_length=1)
        got = tb.prompt(rec, limit)
        assert got == reference(rec, limit)
        assert tb._length(got) <= min(length, limit)
