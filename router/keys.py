"""Step 3 of a request: its block keys (what every routing policy matches on).

``request_keys(p, cfg, tokenizer)`` -> ``(keys, prompt tokens, tokens per key)``:

- token-id prompts (``prompt`` of ints, ``/detokenize``'s ``tokens`` are not keyed):
  ``token_block_keys(ids, block_size, salt)``, full blocks only, as vLLM caches them;
- text prompts, chat ``messages`` and ``/v1/responses`` ``input``: with a tokenizer
  (``tokenizer``: the model's own files) the text is tokenized exactly as vLLM does
  (completions: ``add_special_tokens``; chat: the model's chat template with the
  generation prompt, tokenized), so the keys equal the ones vLLM's KV events translate to
  (``anchorage.routing.vllm_events``) and ``precise_prefix`` works on chat traffic;
  without one, character blocks of ``chars_per_block`` (an approximation, as SGLang's
  router matches characters).
"""

from __future__ import annotations

from typing import Any, Sequence

from anchorage.routing.keys import text_block_keys, token_block_keys
from anchorage.router.config import RouterConfig
from anchorage.router.errors import RouterError, bad_request
from anchorage.router.parsing import Parsed


class ChatTokenizer:
    """The model's tokenizer (transformers, local files only), applied as vLLM applies it."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = len(self.tok)

    def encode_text(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=True)

    def encode_chat(self, messages: list[dict], tools: Any = None) -> list[int]:
        ids = self.tok.apply_chat_template(_plain(messages), tools=tools, tokenize=True,
                                           add_generation_prompt=True, return_dict=False)
        return list(ids)


def _plain(messages: list) -> list[dict]:
    """Content parts -> text (vLLM joins text parts with newlines)."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise bad_request("each message must be an object", "messages")
        c = m.get("content")
        if isinstance(c, list):
            m = {**m, "content": "\n".join(p.get("text", "") for p in c
                                           if isinstance(p, dict) and p.get("type") == "text")}
        out.append(m)
    return out


def _responses_messages(p: Parsed) -> Any:
    inp = p.body.get("input")
    msgs: list[dict] = []
    if isinstance(p.body.get("instructions"), str):
        msgs.append({"role": "system", "content": p.body["instructions"]})
    if isinstance(inp, str):
        return msgs + [{"role": "user", "content": inp}]
    if isinstance(inp, list):
        return msgs + [m for m in inp if isinstance(m, dict) and "role" in m]
    raise bad_request("'input' must be a string or a list of items", "input")


def _flatten(messages: Sequence[Any]) -> str:
    return "".join(f"<{m.get('role')}>{m.get('content')}" if isinstance(m, dict) else str(m)
                   for m in messages)


def request_keys(p: Parsed, cfg: RouterConfig,
                 tokenizer: ChatTokenizer | None = None) -> tuple[list[int], int, float]:
    body, salt = p.body, p.salt
    if p.path == "/detokenize":
        return [], 0, float(cfg.block_size)
    if p.path == "/v1/responses":
        prompt: Any = _responses_messages(p)
    elif "messages" in body and p.path in ("/v1/chat/completions", "/tokenize"):
        prompt = body.get("messages")
        if not isinstance(prompt, list) or not prompt:
            raise bad_request("'messages' must be a non-empty list", "messages")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
            prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return token_block_keys(prompt, cfg.block_size, salt), len(prompt), float(cfg.block_size)
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        if tokenizer is not None:
            try:
                ids = tokenizer.encode_chat(prompt, body.get("tools"))
            except Exception as exc:  # noqa: BLE001 - the template rejects bad input
                raise bad_request(f"the chat template rejected the messages: {exc}",
                                  "messages") from None
            return token_block_keys(ids, cfg.block_size, salt), len(ids), float(cfg.block_size)
        prompt = _flatten(prompt)
    if isinstance(prompt, str):
        if len(prompt) > cfg.max_prompt_chars:
            raise RouterError(413, f"prompt is {len(prompt)} characters; the limit is "
                              f"{cfg.max_prompt_chars}", code="prompt_too_large",
                              reason="prompt_too_large")
        if tokenizer is not None:
            ids = tokenizer.encode_text(prompt)
            return token_block_keys(ids, cfg.block_size, salt), len(ids), float(cfg.block_size)
        return (text_block_keys(prompt, cfg.chars_per_block, salt), len(prompt) // 4,
                cfg.chars_per_block / 4)
    raise bad_request("'prompt' must be a string or a list of token ids", "prompt")
