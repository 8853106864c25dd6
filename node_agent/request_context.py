"""Translate a vLLM ``Request`` into the core's ``RequestContext`` (the metadata contract).

Request metadata reaches the engine as the request's ``session_id`` and
``SamplingParams.extra_args`` (``vllm_xargs`` in the OpenAI API), in the canonical flat
form of ``docs/request-metadata.md`` (vLLM 0.32 accepts only scalar ``vllm_xargs``
values)::

    {"anchorage.agent": str, "anchorage.tool_name": str, "anchorage.tool_args": JSON text,
     "anchorage.warmup": 0|1, "anchorage.tenant": str}

or, through the offline ``LLM`` API where ``extra_args`` may nest, as
``extra_args["anchorage"] = {"agent": ..., "warmup": True, ...}`` (flat keys win).
All fields are optional; a malformed value is ignored (never an error on the serving
path). Block keys are vLLM's own block hashes with the KV-cache group id appended
(``BlockHashWithGroupId``), the same keys ``BlockPool`` caches blocks under.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from anchorage.node_agent.vllm_compat import group_suffix
from anchorage.policies.base import RequestContext
from anchorage.routing.metadata import from_extra_args

GROUP0 = group_suffix(0)  # make_block_hash_with_group_id(h, 0) == h + GROUP0

_clock: Callable[[], float] = time.monotonic


def policy_clock() -> float:
    """The policy clock in the engine: ``time.monotonic`` (replays set a trace clock)."""
    return _clock()


def set_clock(fn: Callable[[], float]) -> Callable[[], float]:
    """Use ``fn`` as the policy clock from now on; returns the previous one."""
    global _clock
    prev, _clock = _clock, fn
    return prev


_FIELDS = ("agent", "tool_name", "tool_args", "warmup", "tenant")


def anchorage_args(request: Any) -> dict[str, Any]:
    """The request's Anchorage metadata as a plain dict (nested and flat forms merged)."""
    sp = getattr(request, "sampling_params", None)
    extra = getattr(sp, "extra_args", None)
    if not isinstance(extra, dict):
        return {}
    nested = extra.get("anchorage")
    out = {k: v for k, v in nested.items() if k in _FIELDS} if isinstance(nested, dict) else {}
    if any(isinstance(k, str) and k.startswith("anchorage.") for k in extra):
        meta = from_extra_args(extra)
        for k in _FIELDS:
            if f"anchorage.{k}" in extra:
                out[k] = getattr(meta, k)
    return out


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


class BlockKeys(Sequence):
    """The request's block keys, made on access (most policies read a few of them)."""

    __slots__ = ("_hashes", "_n", "_suffix")

    def __init__(self, hashes: Sequence[bytes], suffix: bytes):
        self._hashes, self._suffix = hashes, suffix
        self._n = len(hashes)  # the prompt's blocks when the request is scheduled

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [h + self._suffix for h in list(self._hashes[: self._n])[i]]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._hashes[i] + self._suffix


def context_of(request: Any, group_suffix: bytes = GROUP0) -> RequestContext:
    """The policy's view of a vLLM request (prompt block keys, metadata, wall clock)."""
    args = anchorage_args(request)
    num_prompt = int(getattr(request, "num_prompt_tokens", 0) or 0)
    hashes = getattr(request, "block_hashes", None) or ()
    keys = BlockKeys(hashes, group_suffix)
    sp = getattr(request, "sampling_params", None)
    max_tokens = getattr(sp, "max_tokens", None)
    return RequestContext(
        request_id=getattr(request, "request_id", None),
        keys=keys,
        input_length=num_prompt,
        output_length=max_tokens if isinstance(max_tokens, int) else 0,
        now_s=_clock(),
        session_id=_str(getattr(request, "session_id", None)),
        tenant=_str(args.get("tenant")),
        tool_name=_str(args.get("tool_name")),
        tool_args=args.get("tool_args"),
        agent_hint=_str(args.get("agent")),
        warmup=args.get("warmup") in (True, 1),
    )


def anonymous_context() -> RequestContext:
    """For frees the engine makes without a request in hand (deferred frees)."""
    return RequestContext(request_id=None, keys=(), input_length=0, now_s=_clock())
