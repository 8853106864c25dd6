"""From an ``anchorage-trace/v1`` workload to HTTP requests (pure, deterministic).

Specification
-------------
* **Prompts.** Trace block ids are chained prefix ids (docs/trace-format.md). Each id maps
  to a deterministic pseudo-random block of ``block_size`` token ids in ``[3, vocab)``
  (``random.Random("anchorage-drive:<seed>:<tenant>:<id>")``); a request's prompt is the
  concatenation of its blocks cut to ``input_length``, then to ``max_prompt_tokens``
  (cutting keeps the prefix, so reuse is preserved). Equal ids -> equal tokens: the
  engines see exactly the trace's sharing.
* **Sessions.** Requests are grouped by ``session_id`` (a request without one is its own
  session) in trace order. A session starts at its first request's timestamp divided by
  ``time_compression``; within it, each request is sent after the previous one completed
  plus the trace's gap (``next.timestamp - this.timestamp``, i.e. service time plus tool or
  think time) divided by ``time_compression`` and capped at ``max_gap_s``.
* **Metadata.** ``x-session-id`` header; ``anchorage.tool_name`` / ``anchorage.tool_args``
  when the trace's request called a tool (the client knows which tool it is running);
  ``anchorage.agent`` only with ``agent_hints`` (the trace's agent label; off by default:
  Anchorage then recognises agents by their prompt's fingerprint). A trace ``tenant``
  becomes the API key ``Bearer <tenant>``.
* **Session slots** (the replayer's ``max_sessions``, default 8 in the CLI): at most that
  many sessions (agent runs) are in flight; a session starts at ``max(its start time, when
  a slot frees)``, in trace order. Compressing the trace's clock otherwise makes every
  session overlap, which no real fleet of agent runs does.
* **Output.** ``max_tokens = clamp(output_length, 1, max_output_tokens)``.
* **Prompt format** (``prompt_format``): ``ids`` (default) sends the token ids to
  ``/v1/completions``; ``text`` sends text to ``/v1/completions`` and ``chat`` one user
  message to ``/v1/chat/completions``, for engines with a tokenizer (and gateways that
  need text, e.g. ``smg``). Each block id then maps to ``block_size * 3 // 4``
  deterministic words (``TextBlocks``: about a block of tokens), so equal ids are equal
  text and the trace's sharing is kept; prompts are cut to ``max_prompt_tokens``
  measured in words x 4/3, or in tokens when a ``tokenizer`` directory is given.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from anchorage.trace.format import TraceRecord


@dataclass(frozen=True)
class PlanOptions:
    block_size: int = 32
    vocab: int = 1024
    max_prompt_tokens: int = 4000
    max_output_tokens: int = 8
    time_compression: float = 50.0
    max_gap_s: float = 2.0
    agent_hints: bool = False
    seed: int = 0
    model: str = "tiny"
    prompt_format: str = "ids"      # ids | text | chat
    tokenizer: str | None = None    # model dir: measure text prompts in its tokens

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, "
                             f"not {self.prompt_format!r}")


PROMPT_FORMATS = ("ids", "text", "chat")


@dataclass
class PlannedRequest:
    index: int                      # position in the trace
    session: str
    delay_s: float                  # after the session's previous request completed (first: from start)
    body: dict[str, Any]
    headers: dict[str, str]
    agent: str | None = None
    path: str = "/v1/completions"


@dataclass
class SessionPlan:
    session: str
    start_s: float
    requests: list[PlannedRequest] = field(default_factory=list)


class TokenBlocks:
    """Deterministic token blocks per (tenant, block id), memoised."""

    def __init__(self, block_size: int, vocab: int, seed: int = 0) -> None:
        if vocab <= 3:
            raise ValueError("vocab must be > 3")
        self.block_size, self.vocab, self.seed = block_size, vocab, seed
        self._memo: dict[tuple[str, int], list[int]] = {}

    def block(self, tenant: str, bid: int) -> list[int]:
        key = (tenant, bid)
        got = self._memo.get(key)
        if got is None:
            rng = random.Random(f"anchorage-drive:{self.seed}:{tenant}:{bid}")
            got = [rng.randrange(3, self.vocab) for _ in range(self.block_size)]
            self._memo[key] = got
        return got

    def prompt(self, rec: TraceRecord, limit: int) -> list[int]:
        tenant = rec.tenant or ""
        n = min(rec.input_length, limit)
        out: list[int] = []
        for bid in rec.hash_ids:
            if len(out) >= n:
                break
            out.extend(self.block(tenant, bid))
        if len(out) < n:  # trace lists only full blocks (floor): pad from a per-request block
            out.extend(self.block(tenant, -1 - rec.hash_ids[-1] if rec.hash_ids else -1)
                       * (1 + (n - len(out)) // self.block_size))
        return out[:max(1, n)]


class TextBlocks:
    """Deterministic text per (tenant, block id): ``block_size * 3 // 4`` words."""

    WORDS = ("agent tool call result plan step task file code test review search answer "
             "question system user reply function argument error value list read edit run "
             "build check summary report data model cache prefix session the of and to in "
             "is you that it for are as with on be this have from or one by word not what "
             "all we when your can there use an each which do how their if will up other "
             "about out many then them these so some would make like into time has look "
             "two more write go see number no way could people my than first water").split()

    def __init__(self, block_size: int, seed: int = 0, tokenizer: str | None = None) -> None:
        self.words_per_block = max(1, block_size * 3 // 4)
        self.seed = seed
        self._memo: dict[tuple[str, int], str] = {}
        self._tok = None
        if tokenizer:
            from transformers import AutoTokenizer
            self._tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)

    def block(self, tenant: str, bid: int) -> str:
        key = (tenant, bid)
        got = self._memo.get(key)
        if got is None:
            rng = random.Random(f"anchorage-drive-text:{self.seed}:{tenant}:{bid}")
            got = " ".join(rng.choice(self.WORDS) for _ in range(self.words_per_block)) + " "
            self._memo[key] = got
        return got

    def prompt(self, rec: TraceRecord, limit: int) -> str:
        """The record's blocks, in order, until the text is ``min(input_length, limit)``
        tokens long (the fewest blocks that reach it, or all of them), cut to that length.
        The length only grows with blocks, so the count is found by bisection: O(log n)
        tokenizations of the text instead of one per block."""
        tenant = rec.tenant or ""
        ids = list(rec.hash_ids) or [-1]
        target = min(rec.input_length, limit)
        parts = [self.block(tenant, bid) for bid in ids]
        lo, hi = 0, len(parts)      # the fewest blocks k whose text reaches target: in [lo, hi]
        while lo < hi:
            k = (lo + hi) // 2
            if self._length("".join(parts[:k])) >= target:
                hi = k
            else:
                lo = k + 1
        return self._cut("".join(parts[:lo]), target)

    def _length(self, text: str) -> int:
        if self._tok is not None:
            return len(self._tok.encode(text, add_special_tokens=False))
        return len(text.split()) * 4 // 3

    def _cut(self, text: str, limit: int) -> str:
        words = text.split()
        while words and self._length(" ".join(words)) > limit:
            words = words[: max(1, int(len(words) * 0.9))] if len(words) > 1 else []
        return " ".join(words) or "hello"


def _prompt_fields(opts: "PlanOptions", text: "TextBlocks | None", blocks: TokenBlocks,
                   rec: TraceRecord) -> tuple[str, dict[str, Any]]:
    if opts.prompt_format == "ids":
        return "/v1/completions", {"prompt": blocks.prompt(rec, opts.max_prompt_tokens)}
    prompt = text.prompt(rec, opts.max_prompt_tokens)
    if opts.prompt_format == "text":
        return "/v1/completions", {"prompt": prompt}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}


def plan(records: Iterable[TraceRecord], opts: PlanOptions = PlanOptions()) -> list[SessionPlan]:
    blocks = TokenBlocks(opts.block_size, opts.vocab, opts.seed)
    text = (TextBlocks(opts.block_size, opts.seed, opts.tokenizer)
            if opts.prompt_format != "ids" else None)
    sessions: dict[str, SessionPlan] = {}
    last_ts: dict[str, float] = {}
    for i, rec in enumerate(records):
        sid = rec.session_id if rec.session_id is not None else f"req-{i}"
        path, fields = _prompt_fields(opts, text, blocks, rec)
        body: dict[str, Any] = {
            "model": opts.model, **fields,
            "max_tokens": max(1, min(rec.output_length, opts.max_output_tokens)),
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
        }
        xargs: dict[str, Any] = {}
        if rec.tool_name:
            xargs["anchorage.tool_name"] = rec.tool_name
            if rec.tool_args is not None:
                xargs["anchorage.tool_args"] = json.dumps(rec.tool_args, sort_keys=True)
        if opts.agent_hints and rec.agent:
            xargs["anchorage.agent"] = rec.agent
        if xargs:
            body["vllm_xargs"] = xargs
        headers = {"x-session-id": sid}
        if rec.tenant:
            headers["authorization"] = f"Bearer {rec.tenant}"
        ts = rec.timestamp / 1000.0 / opts.time_compression
        sp = sessions.get(sid)
        if sp is None:
            sp = sessions[sid] = SessionPlan(sid, ts)
            delay = 0.0
        else:
            delay = min(opts.max_gap_s, max(0.0, ts - last_ts[sid]))
        last_ts[sid] = ts
        sp.requests.append(PlannedRequest(i, sid, delay, body, headers, rec.agent, path))
    return sorted(sessions.values(), key=lambda s: s.start_s)


def count(plans: list[SessionPlan]) -> int:
    return sum(len(s.requests) for s in plans)
