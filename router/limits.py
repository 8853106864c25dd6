"""Step 1 of a request: limits, before anything is parsed or stored.

- ``check_headers(headers, cfg)``: the request's headers together under
  ``max_header_bytes`` (431).
- ``read_body(stream, cfg, declared)``: the body under ``max_body_bytes`` (413), arriving
  within ``body_timeout_s`` (408: a client that stops mid-body does not hold the router).
- ``check_depth(raw, cfg)``: JSON nested deeper than ``max_json_depth`` is a 400 (the
  parser's recursion limit would otherwise be a 500); scanned only when the body has
  more brackets than the limit, so an ordinary request costs one ``bytes.count``.
- ``check_request(body, meta, cfg, model)``: per-field caps after parsing: session id and
  hint lengths, ``n``/``best_of``, and token ids in ``[0, vocab)`` for the model (an id at
  or above the vocabulary kills a vLLM engine that skips tokenizer initialisation).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable

from anchorage.router.config import RouterConfig
from anchorage.router.errors import RouterError, bad_request


def check_headers(headers: Iterable[tuple[bytes, bytes]], cfg: RouterConfig) -> None:
    total = sum(len(k) + len(v) + 4 for k, v in headers)
    if total > cfg.max_header_bytes:
        raise RouterError(431, f"request headers are {total} bytes; the limit is "
                          f"{cfg.max_header_bytes}", code="headers_too_large",
                          reason="headers_too_large")


async def read_body(stream: AsyncIterator[bytes], cfg: RouterConfig,
                    declared: str | None) -> bytes:
    if declared and declared.isdigit() and int(declared) > cfg.max_body_bytes:
        raise RouterError(413, f"request body is {declared} bytes; the limit is "
                          f"{cfg.max_body_bytes}", code="request_too_large",
                          reason="request_too_large")
    parts: list[bytes] = []
    size = 0

    async def collect() -> None:
        nonlocal size
        async for chunk in stream:
            size += len(chunk)
            if size > cfg.max_body_bytes:
                raise RouterError(413, f"request body exceeds {cfg.max_body_bytes} bytes",
                                  code="request_too_large", reason="request_too_large")
            parts.append(chunk)
    try:
        async with asyncio.timeout(cfg.body_timeout_s):    # no task per request
            await collect()
    except TimeoutError:
        raise RouterError(408, f"request body not received within {cfg.body_timeout_s:g} s",
                          code="request_timeout", reason="body_timeout") from None
    return b"".join(parts)


def _depth(obj: Any, limit: int) -> int:
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if d > deepest:
            deepest = d
            if deepest > limit:
                return deepest
        if isinstance(o, dict):
            todo.extend((v, d + 1) for v in o.values() if isinstance(v, (dict, list)))
        elif isinstance(o, list):
            todo.extend((v, d + 1) for v in o if isinstance(v, (dict, list)))
    return deepest


def check_depth_raw(raw: bytes, cfg: RouterConfig) -> bool:
    """True when the body may nest deeper than the limit (worth a scan after parsing)."""
    return raw.count(b"[") + raw.count(b"{") > cfg.max_json_depth


def check_depth(body: Any, cfg: RouterConfig) -> None:
    if _depth(body, cfg.max_json_depth) > cfg.max_json_depth:
        raise bad_request(f"request JSON is nested deeper than {cfg.max_json_depth} levels",
                          code="too_deep")


def _cap(value: Any, limit: int, what: str, param: str) -> None:
    if isinstance(value, str) and len(value) > limit:
        raise bad_request(f"{what} is {len(value)} characters; the limit is {limit}", param,
                          code="too_long")


def check_request(body: dict[str, Any], meta: Any, cfg: RouterConfig, model: str | None) -> None:
    _cap(meta.session_id, cfg.max_session_id_chars, "the session id", "session_id")
    _cap(meta.agent, cfg.max_hint_chars, "anchorage.agent", "anchorage.agent")
    _cap(meta.tool_name, cfg.max_hint_chars, "anchorage.tool_name", "anchorage.tool_name")
    for name in ("n", "best_of"):
        v = body.get(name)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not
                              1 <= v <= cfg.max_n):
            raise bad_request(f"'{name}' must be an integer in 1..{cfg.max_n}", name)
    vocab = cfg.vocab_for(model)
    if vocab:
        for name in ("prompt", "tokens"):
            check_token_ids(body.get(name), vocab, name)


def check_token_ids(prompt: Any, vocab: int, param: str) -> None:
    """Token-id prompts (a list of ints, or a list of such lists) within [0, vocab)."""
    if not isinstance(prompt, list) or not prompt:
        return
    seqs = prompt if isinstance(prompt[0], list) else [prompt]
    for seq in seqs:
        if not isinstance(seq, list) or not seq or not isinstance(seq[0], int):
            continue
        try:
            lo, hi = min(seq), max(seq)
        except TypeError:
            raise bad_request(f"'{param}' token ids must be integers", param) from None
        if lo < 0 or hi >= vocab:
            bad = hi if hi >= vocab else lo
            raise bad_request(f"token id {bad} in '{param}' is outside the model's vocabulary "
                              f"[0, {vocab})", param, code="invalid_token_id")
