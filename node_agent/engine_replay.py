"""Replay an ``anchorage-trace/v1`` workload through an in-process vLLM engine (tests and
``bench/bench_engine.py``), and the same workload through the simulator's pool model.

Specification
-------------
* **Fitting.** ``fit_records`` cuts each record to what the engine is sent: the prompt to
  ``max_prompt_tokens`` (``hash_ids`` to the prompt's full blocks) and the output to
  ``[1, max_output_tokens]`` tokens. The simulator replays the fitted records, so both see
  exactly one workload (comparing an engine to a simulation of uncut prompts is comparing
  two workloads).
* **Prompts and metadata** as ``anchorage drive`` sends them (``anchorage.drive.plan``):
  equal block ids give equal token blocks; ``session_id``; flat ``vllm_xargs``
  (``anchorage.tool_name`` / ``anchorage.tool_args``) for a request that called a tool.
* ``sequential``: trace order, one request at a time, the policy clock set to the trace
  time (the simulator's sequential ``replay``): with a faithful pool model both give the
  same hits.
* ``closed_loop``: agent sessions as the drive runs them (``plan.plan``: a session starts
  at its trace time / ``time_compression``; each next request follows the previous one's
  completion after the trace gap / ``time_compression``, capped at ``max_gap_s``; at most
  ``max_sessions`` sessions and ``max_in_flight`` requests in flight), the engine stepped
  here. ``clock="virtual"``: time advances ``step_s`` per engine step and jumps over idle
  time (deterministic: tests); ``"wall"``: the real clock, sleeping while idle;
  ``"cpu"``: the process's CPU time, jumping over idle time (benchmarks on a shared
  machine: what the engine and the policy cost, not what the neighbours do). The policy clock is that clock. TTFT: from submission to the first token.
* Hit rate: cached prompt blocks (``num_cached_tokens / block_size``) over the fitted
  records' full prompt blocks, the simulator's ``hit_rate``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from anchorage.node_agent import request_context

from anchorage.drive.plan import PlanOptions, TokenBlocks, plan
from anchorage.trace.format import TraceRecord


def fit_records(records: Sequence[TraceRecord], block_size: int, max_prompt_tokens: int,
                max_output_tokens: int) -> list[TraceRecord]:
    out = []
    for r in records:
        n = min(r.input_length, max_prompt_tokens)
        out.append(replace(r, input_length=n, hash_ids=list(r.hash_ids[: n // block_size]),
                           output_length=max(1, min(r.output_length, max_output_tokens))))
    return out


@dataclass
class Outcome:
    index: int
    session: str | None
    prompt_blocks: int
    cached_tokens: int
    submitted_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float | None = None


@dataclass
class EngineRun:
    outcomes: list[Outcome]
    block_size: int
    wall_s: float
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float:
        p = sum(o.prompt_blocks for o in self.outcomes)
        return sum(o.cached_tokens // self.block_size for o in self.outcomes) / p if p else 0.0

    @property
    def ttft_mean_s(self) -> float:
        xs = [o.ttft_s for o in self.outcomes if o.ttft_s is not None]
        return sum(xs) / len(xs) if xs else 0.0

    def cached_tokens(self) -> list[int]:
        return [o.cached_tokens for o in sorted(self.outcomes, key=lambda o: o.index)]


def _request(body: dict[str, Any], headers: dict[str, str], SamplingParams, TokensPrompt):
    xargs = body.get("vllm_xargs")
    sp = SamplingParams(max_tokens=body["max_tokens"], temperature=0.0, ignore_eos=True,
                        extra_args=dict(xargs) if xargs else None)
    return TokensPrompt(prompt_token_ids=body["prompt"]), sp, headers.get("x-session-id")


def _imports():
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    return SamplingParams, TokensPrompt


def _options(block_size: int, vocab: int, records: Sequence[TraceRecord],
             **kw: Any) -> PlanOptions:
    longest = max((r.input_length for r in records), default=1)
    out = max((r.output_length for r in records), default=1)
    return PlanOptions(block_size=block_size, vocab=vocab, max_prompt_tokens=longest,
                       max_output_tokens=out, **kw)


def sequential(llm: Any, records: Sequence[TraceRecord], block_size: int,
               vocab: int = 1024) -> EngineRun:
    """One request at a time in trace order; policy clock = the record's timestamp."""
    SamplingParams, TokensPrompt = _imports()
    blocks = TokenBlocks(block_size, vocab)
    now = [0.0]
    prev = request_context.set_clock(lambda: now[0])
    outcomes = []
    t0 = time.perf_counter()
    try:
        for i, rec in enumerate(records):
            now[0] = rec.timestamp / 1000.0
            xargs: dict[str, Any] = {}
            if rec.tool_name:
                xargs["anchorage.tool_name"] = rec.tool_name
                if rec.tool_args is not None:
                    xargs["anchorage.tool_args"] = json.dumps(rec.tool_args, sort_keys=True)
            sp = SamplingParams(max_tokens=rec.output_length, temperature=0.0, ignore_eos=True,
                                extra_args=xargs or None)
            prompt = TokensPrompt(prompt_token_ids=blocks.prompt(rec, rec.input_length))
            eng = llm.llm_engine
            rid = f"seq-{i}"
            eng.add_request(rid, prompt, sp, session_id=rec.session_id)
            cached = None
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.finished:
                        cached = o.num_cached_tokens or 0
            outcomes.append(Outcome(i, rec.session_id, len(rec.hash_ids), cached or 0))
    finally:
        request_context.set_clock(prev)
    return EngineRun(outcomes, block_size, time.perf_counter() - t0)


class VirtualClock:
    def __init__(self, step_s: float = 0.01):
        self.t = 0.0
        self.step_s = step_s

    def now(self) -> float:
        return self.t

    def stepped(self) -> None:
        self.t += self.step_s

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)


class WallClock:
    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stepped(self) -> None:
        pass

    def idle_until(self, t: float) -> None:
        d = t - self.now()
        if d > 0:
            time.sleep(d)


class CpuClock:
    """The process's CPU time (engine steps, the policy, this loop), jumping over idle
    time: the timeline of a dedicated machine, measured on a shared one."""

    def __init__(self):
        self.offset = -time.process_time()

    def now(self) -> float:
        return self.offset + time.process_time()

    def stepped(self) -> None:
        pass

    def idle_until(self, t: float) -> None:
        self.offset += max(0.0, t - self.now())


CLOCKS = {"virtual": VirtualClock, "wall": WallClock, "cpu": CpuClock}


def closed_loop(llm: Any, records: Sequence[TraceRecord], block_size: int, *,
                vocab: int = 1024, time_compression: float = 50.0, max_gap_s: float = 2.0,
                max_sessions: int = 8, max_in_flight: int = 6, clock: str = "virtual",
                step_s: float = 0.01,
                on_step: Callable[[float], None] | None = None) -> EngineRun:
    """Sessions in flight as the drive runs them, through ``llm``'s engine (see module doc)."""
    SamplingParams, TokensPrompt = _imports()
    opts = _options(block_size, vocab, records, time_compression=time_compression,
                    max_gap_s=max_gap_s)
    sessions = plan(records, opts)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    clk = VirtualClock(step_s) if clock == "virtual" else CLOCKS[clock]()
    prev = request_context.set_clock(clk.now)
    eng = llm.llm_engine
    # active sessions: [plan, next request position (-1 - k: request k in flight), ready]
    todo = list(sessions)
    active: list[list] = []
    inflight: dict[str, tuple[list, Any, Outcome]] = {}
    outcomes: list[Outcome] = []
    steps = 0
    t_wall = time.perf_counter()
    try:
        while todo or active or inflight:
            now = clk.now()
            while todo and len(active) < max_sessions:  # slots taken in plan order
                sp = todo.pop(0)
                active.append([sp, 0, max(now, sp.start_s)])
            # submit ready requests (earliest first) while there is room
            ready = sorted((a for a in active if a[1] >= 0 and a[2] <= now),
                           key=lambda a: a[2])
            for a in ready:
                if len(inflight) >= max_in_flight:
                    break
                sp, k = a[0], a[1]
                req = sp.requests[k]
                prompt, params, sid = _request(req.body, req.headers, SamplingParams,
                                               TokensPrompt)
                rid = f"r{req.index}"
                eng.add_request(rid, prompt, params, session_id=sid)
                rec = records[req.index]
                o = Outcome(req.index, sid, len(rec.hash_ids), 0, submitted_s=now)
                inflight[rid] = (a, req, o)
                a[1] = -1 - k  # waiting for this request
            if inflight:
                outs = eng.step()
                steps += 1
                clk.stepped()
                now = clk.now()
                if on_step is not None:
                    on_step(now)
                for out in outs:
                    entry = inflight.get(out.request_id)
                    if entry is None:
                        continue
                    a, req, o = entry
                    if o.ttft_s is None and out.outputs and out.outputs[0].token_ids:
                        o.ttft_s = now - o.submitted_s
                    if out.finished:
                        del inflight[out.request_id]
                        o.cached_tokens = out.num_cached_tokens or 0
                        o.latency_s = now - o.submitted_s
                        if o.ttft_s is None:
                            o.ttft_s = o.latency_s
                        outcomes.append(o)
                        k = -1 - a[1] + 1
                        if k < len(a[0].requests):
                            a[1], a[2] = k, now + a[0].requests[k].delay_s
                        else:
                            active.remove(a)
                continue
            waits = [a[2] for a in active if a[1] >= 0]
            if waits:
                clk.idle_until(min(waits))
            elif todo:
                clk.idle_until(todo[0].start_s)
    finally:
        request_context.set_clock(prev)
    return EngineRun(outcomes, block_size, time.perf_counter() - t_wall, steps)


def simulate(records: Sequence[TraceRecord], capacity_blocks: int, block_size: int,
             policy: str, params: dict[str, Any] | None = None) -> float:
    """The simulator's sequential hit rate of the same (fitted) records."""
    from anchorage.policies.registry import make_policy
    from anchorage.sim.replay import make_contexts, replay

    ctx = make_contexts(records)
    pol = make_policy(policy, block_size=block_size, contexts=ctx, params=params)
    return replay(ctx, capacity_blocks, block_size, pol).hit_rate
