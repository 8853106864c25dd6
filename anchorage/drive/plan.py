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


@dataclass
class PlannedRequest:
    index: int                      # position in the trace
    session: str
    delay_s: float                  # after the session's previous request completed (first: from start)
    body: dict[str, Any]
    headers: dict[str, str]
    agent: str | None = None


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


def plan(records: Iterable[TraceRecord], opts: PlanOptions = PlanOptions()) -> list[SessionPlan]:
    blocks = TokenBlocks(opts.block_size, opts.vocab, opts.seed)
    sessions: dict[str, SessionPlan] = {}
    last_ts: dict[str, float] = {}
    for i, rec in enumerate(records):
        sid = rec.session_id if rec.session_id is not None else f"req-{i}"
        body: dict[str, Any] = {
            "model": opts.model, "prompt": blocks.prompt(rec, opts.max_prompt_tokens),
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
        sp.requests.append(PlannedRequest(i, sid, delay, body, headers, rec.agent))
    return sorted(sessions.values(), key=lambda s: s.start_s)


def count(plans: list[SessionPlan]) -> int:
    return sum(len(s.requests) for s in plans)
