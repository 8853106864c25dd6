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
from anchorage.pool.block_pool import BlockPool
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

    def stepped(self, step_s: float | None = None) -> None:
        self.t += self.step_s

    def idle_until(self, t: float) -> None:
        self.t = max(self.t, t)


class ModelClock(VirtualClock):
    """Time advances by each step's modelled duration (``SimEngine`` only: the cost model
    of its profile), jumping over idle time."""

    def stepped(self, step_s: float | None = None) -> None:
        if step_s is None:
            raise ValueError("clock='model' needs an engine that models step times (SimEngine)")
        self.t += step_s


class WallClock:
    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stepped(self, step_s: float | None = None) -> None:
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

    def stepped(self, step_s: float | None = None) -> None:
        pass

    def idle_until(self, t: float) -> None:
        self.offset += max(0.0, t - self.now())


CLOCKS = {"virtual": VirtualClock, "wall": WallClock, "cpu": CpuClock, "model": ModelClock}


@dataclass
class StepOutput:
    """What ``closed_loop`` reads of one request after a step (vLLM's ``RequestOutput``)."""

    request_id: str
    first_token: bool   # it has produced at least one token
    finished: bool
    cached_tokens: int  # prefix-cache hit at its (first) admission, tokens


class _VllmEngine:
    """``closed_loop``'s view of an in-process ``vllm.LLM``."""

    step_s = None  # real steps take real time

    def __init__(self, llm: Any):
        self.eng = llm.llm_engine
        self.SamplingParams, self.TokensPrompt = _imports()

    def submit(self, rid: str, req: Any, index: int, now: float) -> None:
        prompt, params, sid = _request(req.body, req.headers, self.SamplingParams,
                                       self.TokensPrompt)
        self.eng.add_request(rid, prompt, params, session_id=sid)

    def step(self, now: float) -> list[StepOutput]:
        return [StepOutput(o.request_id, bool(o.outputs and o.outputs[0].token_ids),
                           o.finished, o.num_cached_tokens or 0) for o in self.eng.step()]


class SimEngine:
    """The timed simulator's replica (``anchorage.sim.engine.Replica``: vLLM's scheduler
    and ``anchorage.pool.block_pool``) behind the calls ``closed_loop`` makes of the real
    engine, so that both run one admission discipline. ``records`` are the replayed
    (fitted) records; a submitted request is its record's context (``make_contexts``, as
    ``simulate`` uses). ``profile``: a ``HardwareProfile`` (its ``max_num_seqs``,
    ``max_num_batched_tokens`` and cost model; ``anchorage.sim.profiles.PROFILES``);
    ``capacity_blocks``: usable blocks (the engine's ``num_gpu_blocks - 1``).

    The policy hears of a request as the plugin tells it in vLLM: ``on_request`` at the
    request's first admission attempt (the scheduler looks the head waiting request up
    at every step until it fits; the plugin reports the first look-up), not at the
    allocation that follows once blocks were freed. With one request in flight the two
    coincide; with several, a request that waits for blocks is known to the policy while
    the running ones finish and free theirs."""

    def __init__(self, records: Sequence[TraceRecord], capacity_blocks: int, policy: str,
                 profile: Any, params: dict[str, Any] | None = None):
        from anchorage.policies.registry import make_policy
        from anchorage.sim.engine import Replica
        from anchorage.sim.replay import make_contexts

        self.ctxs = make_contexts(records)
        bs = profile.block_size
        self.policy = make_policy(policy, block_size=bs, contexts=self.ctxs, params=params)
        self.pool = FirstAttemptPool(capacity_blocks, bs, self.policy)
        self.replica = Replica(0, profile, self.pool)
        self.step_s: float | None = None
        self._rid: dict[int, str] = {}
        self._hit: dict[int, int] = {}  # request index -> hit tokens at first admission

    def submit(self, rid: str, req: Any, index: int, now: float) -> None:
        from anchorage.sim.engine import SimRequest

        r = SimRequest(self.ctxs[index], now, session=req.session, index=index)
        if not self.replica.fits_ever(r):
            raise ValueError(f"request {index} ({r.prompt_len} tokens) cannot fit the pool")
        self._rid[index] = rid
        self.pool.waiting[id(r.ctx.keys)] = r.ctx
        self.replica.enqueue(r)

    def step(self, now: float) -> list[StepOutput]:
        self.pool.now = now
        plan = self.replica.plan_step(now)
        if plan is None:
            self.step_s = 0.0
            return []
        for r, _, _ in plan.items:
            self._hit.setdefault(r.index, r.hit_tokens)
        done = self.replica.finish_step(plan)
        self.step_s = plan.duration_s
        fin = {id(r) for r in done}
        return [StepOutput(self._rid[r.index], r.first_token_s is not None, id(r) in fin,
                           self._hit[r.index])
                for r, _, _ in plan.items]


class FirstAttemptPool(BlockPool):
    """``BlockPool`` whose policy gets ``on_request`` at the first prefix look-up of a
    submitted request (the scheduler's first admission attempt: ``can_allocate``), once
    per admission, as the plugin reports it in vLLM; ``on_queued`` is not sent (the
    plugin does not see vLLM's queue). ``waiting`` holds the submitted contexts not yet
    looked up (by ``id(ctx.keys)``); ``now`` is the current step's time."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.now = 0.0
        self.waiting: dict[int, Any] = {}
        told: set[int] = set()  # id(ctx) told on_request, not done yet
        pol = self.policy
        on_request, on_done = pol.on_request, pol.on_request_done

        def once(ctx: Any) -> None:
            if id(ctx) not in told:
                told.add(id(ctx))
                on_request(ctx)

        def done(ctx: Any) -> None:
            told.discard(id(ctx))
            on_done(ctx)

        # this policy instance only
        pol.on_request, pol.on_request_done = once, done
        pol.on_queued = lambda ctx: None

    def num_hit_blocks(self, keys: Any, num_prompt_tokens: int) -> int:
        ctx = self.waiting.pop(id(keys), None)
        if ctx is not None:
            ctx.now_s = self.now
            self.policy.on_request(ctx)
        return super().num_hit_blocks(keys, num_prompt_tokens)


def closed_loop(llm: Any, records: Sequence[TraceRecord], block_size: int, *,
                vocab: int = 1024, time_compression: float = 50.0, max_gap_s: float = 2.0,
                max_sessions: int = 8, max_in_flight: int = 6, clock: str = "virtual",
                step_s: float = 0.01,
                on_step: Callable[[float], None] | None = None) -> EngineRun:
    """Sessions in flight as the drive runs them, through ``llm``'s engine (a ``vllm.LLM``
    or a ``SimEngine``; see module doc)."""
    opts = _options(block_size, vocab, records, time_compression=time_compression,
                    max_gap_s=max_gap_s)
    sessions = plan(records, opts)
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    eng = llm if isinstance(llm, SimEngine) else _VllmEngine(llm)
    clk = VirtualClock(step_s) if clock == "virtual" else CLOCKS[clock]()
    prev = request_context.set_clock(clk.now)
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
                rid = f"r{req.index}"
                eng.submit(rid, req, req.index, now)
                rec = records[req.index]
                o = Outcome(req.index, req.session, len(rec.hash_ids), 0, submitted_s=now)
                inflight[rid] = (a, req, o)
                a[1] = -1 - k  # waiting for this request
            if inflight:
                outs = eng.step(now)
                steps += 1
                clk.stepped(eng.step_s)
                now = clk.now()
                if on_step is not None:
                    on_step(now)
                for out in outs:
                    entry = inflight.get(out.request_id)
                    if entry is None:
                        continue
                    a, req, o = entry
                    if o.ttft_s is None and out.first_token:
                        o.ttft_s = now - o.submitted_s
                    if out.finished:
                        del inflight[out.request_id]
                        o.cached_tokens = out.cached_tokens
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
