"""Synthetic multi-agent workloads with a known topology (the generator behind
`anchorage trace generate`).

Specification
-------------
``generate(topology, agents, sessions, seed, **opts) -> (TraceHeader, [TraceRecord])`` is
pure and deterministic for a seed. It models a fleet of agent sessions sharing one engine:

* **Agents.** ``agents`` named agents whose roles depend on the topology (below). Each has
  an *anchor* (system prompt + tool schemas, lognormal with median ``anchor_tokens``,
  clipped to [300, 8000] tokens, i.e. tens to hundreds of blocks) that is the first part
  of every prompt it receives, in every session: anchors are the cross-session reuse.
  Each agent has 2-3 tools, a tool-call probability and an output-length median.
* **Prompt of a request** = anchor(agent) + session task (lognormal, median 250 tokens,
  unique per session) + the session history visible to the agent, in order. History
  grows by each request's output and each tool's result, so an agent's next prompt in a
  session extends its previous one (within-session reuse). ``hierarchical`` keeps each
  worker's turns private to the worker and its lead; all other topologies share the
  whole history. When a prompt would exceed ``max_context_tokens`` the session compacts
  its history into a ~1,000-token summary (as coding agents do), which breaks the chain.
* **Block ids** come from ``anchorage.trace.blocks.PrefixIds`` over block contents
  (pieces of named chunks), so an equal id at position i means the same prompt through
  block i; ids are renumbered by first appearance in time order.
* **Next agent.** After a tool call the same agent continues with the tool's result.
  Otherwise the next agent is drawn from the topology's transition matrix
  ``transition_matrix(topology, agents, seed)``:

  - ``pipeline`` (stage0..): stage i -> i+1 (0.85), back to i-1 for rework (0.10), stay
    (0.05); the last stage goes back to stage0 (next iteration, 0.7) or to the previous
    stage (0.3).
  - ``debate`` (debater0.., judge): debaters speak in turn (0.8 to the next, 0.2 to a random
    other); the last debater hands to the judge (0.9); the judge restarts the round (0.9).
  - ``selector`` (selector, worker0..): the selector picks worker j with Zipf(1) weights;
    a worker returns to the selector (0.9) or keeps going (0.1).
  - ``hierarchical`` (manager, lead0.., worker<j>.<k>): manager -> a lead; lead -> one of
    its workers (0.8) or the manager (0.2); worker -> its lead (0.85) or a sibling (0.15).
  - ``handoff`` (triage, specialist0..): triage routes to specialists with Zipf weights;
    each specialist has two preferred hand-off targets (0.35 each), triage (0.2) and the
    rest share 0.1.
  - ``random`` (agent0..): rows drawn from Dirichlet(50): near-uniform, nothing to learn.

  Each session's task favours two agents (``session_transitions``): in ``selector``,
  ``handoff`` and ``hierarchical`` the chance of moving to them is multiplied by
  ``session_affinity`` (default 4), so a session's own history predicts its next agent
  better than the global matrix does.

* **Tools.** A tool call's duration is lognormal with parameters per (tool, argument
  class), e.g. ``read_file`` of a source file (median 15 ms) vs of a data dump (120 ms),
  ``run_tests`` on one test file (6 s) vs the whole suite (75 s); see ``TOOLS``. The
  record carries ``tool_name``, ``tool_args`` (with the argument that decides the class)
  and ``tool_duration_ms``. Without a tool, the next request follows after a think time
  (lognormal, median ``think_ms``).
* **Time.** Session lengths are geometric with mean ``mean_requests`` (>= 2). A request
  takes an estimated service time ``30 ms + input/10 tokens per ms + output x 15 ms``; the
  session's next request comes after it completes plus the tool duration or think time.
  Sessions arrive as a Poisson process whose rate makes about ``concurrency`` sessions run
  at once (rate = concurrency / mean session duration), so they interleave on one clock.
* ``tenants`` > 0 assigns each session to one of that many tenants (``tenant0``..).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Any, Callable

from anchorage.trace.blocks import ROOT, PrefixIds
from anchorage.trace.format import FORMAT, TraceHeader, TraceRecord
from anchorage.trace.topologies import (  # noqa: F401 - TOPOLOGIES, agent_names re-exported
    TOPOLOGIES, _check_topology, agent_names, session_transitions, start_agent,
    transition_matrix)



# ---------------------------------------------------------------------------------------
# Tools: duration and result size per (tool, argument class)

@dataclass(frozen=True)
class ArgClass:
    name: str
    weight: float
    median_ms: float
    sigma: float
    result_tokens: int  # median tokens of the tool result appended to the history
    args: Callable[[random.Random], dict[str, Any]]


def _k(rng: random.Random, n: int = 40) -> int:
    return rng.randrange(n)


TOOLS: dict[str, tuple[ArgClass, ...]] = {
    "read_file": (
        ArgClass("source", 0.8, 15, 0.5, 500, lambda r: {"path": f"src/mod{_k(r)}.py"}),
        ArgClass("data", 0.2, 120, 0.6, 2500, lambda r: {"path": f"data/dump{_k(r, 8)}.json"}),
    ),
    "grep": (
        ArgClass("dir", 0.7, 150, 0.5, 200,
                 lambda r: {"pattern": f"def f{_k(r)}", "path": "src/"}),
        ArgClass("repo", 0.3, 1200, 0.6, 600, lambda r: {"pattern": f"TODO{_k(r)}", "path": "."}),
    ),
    "write_file": (
        ArgClass("file", 1.0, 40, 0.4, 30, lambda r: {"path": f"src/mod{_k(r)}.py"}),
    ),
    "run_tests": (
        ArgClass("file", 0.7, 6_000, 0.5, 400, lambda r: {"path": f"tests/test_mod{_k(r)}.py"}),
        ArgClass("suite", 0.3, 75_000, 0.4, 1500, lambda r: {"path": "tests/"}),
    ),
    "shell": (
        ArgClass("quick", 0.7, 60, 0.5, 150,
                 lambda r: {"cmd": r.choice(["ls", "git status", "git diff", "pwd"])}),
        ArgClass("build", 0.3, 35_000, 0.5, 800,
                 lambda r: {"cmd": r.choice(["make build", "cargo build", "npm run build"])}),
    ),
    "web_search": (
        ArgClass("query", 1.0, 1_800, 0.6, 1200, lambda r: {"query": f"topic {_k(r, 200)}"}),
    ),
    "python": (
        ArgClass("snippet", 1.0, 700, 0.8, 300, lambda r: {"code": f"print(f({_k(r)}))"}),
    ),
    "ask_user": (
        ArgClass("question", 1.0, 25_000, 1.0, 80, lambda r: {"question": f"q{_k(r, 100)}"}),
    ),
}
# ask_user (a human in the loop) is only given to the handoff triage agent.
_TOOL_NAMES = sorted(t for t in TOOLS if t != "ask_user")


# ---------------------------------------------------------------------------------------
# Agents

@dataclass(frozen=True)
class AgentSpec:
    name: str
    anchor_tokens: int
    tools: tuple[str, ...]
    tool_prob: float
    output_median: int


_COORDINATORS = ("judge", "selector", "manager", "triage", "lead")


def make_agents(topology: str, agents: int, seed: int, anchor_tokens: int) -> list[AgentSpec]:
    rng = random.Random(f"anchorage-agents:{topology}:{agents}:{seed}")
    out = []
    for name in agent_names(topology, agents):
        coord = name.startswith(_COORDINATORS)
        tools = rng.sample(_TOOL_NAMES, rng.choice((2, 3)))
        if topology == "handoff" and name == "triage":
            tools = ["ask_user", tools[0]]
        out.append(AgentSpec(
            name=name,
            anchor_tokens=int(min(8000, max(300, rng.lognormvariate(math.log(anchor_tokens),
                                                                       0.5)))),
            tools=tuple(tools),
            tool_prob=rng.uniform(0.05, 0.2) if coord else rng.uniform(0.3, 0.65),
            output_median=int(rng.uniform(80, 200) if coord else rng.uniform(150, 500)),
        ))
    return out


# ---------------------------------------------------------------------------------------
# Prompts as chunk lists, blockified incrementally

class _PromptChain:
    """One agent's prompt in one session: an append-only list of (key, tokens) chunks and
    the ids of its full blocks. Appending keeps earlier full blocks (same prefix)."""

    __slots__ = ("keys", "starts", "tokens", "chain", "seen", "epoch")

    def __init__(self, epoch: int):
        self.keys: list[Any] = []
        self.starts: list[int] = []
        self.tokens = 0
        self.chain: list[int] = []
        self.seen = 0  # session segments scanned so far
        self.epoch = epoch

    def append(self, key: Any, tokens: int) -> None:
        if tokens > 0:
            self.keys.append(key)
            self.starts.append(self.tokens)
            self.tokens += tokens

    def _content(self, lo: int, hi: int) -> tuple:
        pieces = []
        i = bisect.bisect_right(self.starts, lo) - 1
        pos = lo
        while pos < hi:
            end = self.starts[i + 1] if i + 1 < len(self.starts) else self.tokens
            take = min(hi, end) - pos
            pieces.append((self.keys[i], pos - self.starts[i], take))
            pos += take
            i += 1
        return tuple(pieces)

    def hash_ids(self, ids: PrefixIds, bs: int) -> list[int]:
        full = self.tokens // bs
        for b in range(len(self.chain), full):
            parent = self.chain[-1] if self.chain else ROOT
            self.chain.append(ids.child(parent, self._content(b * bs, (b + 1) * bs)))
        out = list(self.chain)
        if self.tokens % bs:
            parent = out[-1] if out else ROOT
            out.append(ids.child(parent, self._content(full * bs, self.tokens)))
        return out


# ---------------------------------------------------------------------------------------
# The generator

@dataclass
class _Event:
    t_ms: float  # relative to the session start
    session: int
    step: int
    rec: dict[str, Any]


def service_ms(input_tokens: int, output_tokens: int) -> float:
    """Estimated time a request occupies the engine (prefill + decode), in ms."""
    return 30.0 + input_tokens / 10.0 + output_tokens * 15.0


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(median), sigma)


def _draw(rng: random.Random, weights: list[float]) -> int:
    return rng.choices(range(len(weights)), weights=weights)[0]


def generate(topology: str, agents: int, sessions: int, seed: int, *, block_size: int = 16,
             mean_requests: float = 16.0, concurrency: float = 64.0,
             anchor_tokens: int = 1500, max_context_tokens: int = 32768,
             think_ms: float = 300.0, tenants: int = 0, session_affinity: float = 4.0
             ) -> tuple[TraceHeader, list[TraceRecord]]:
    """Generate a workload; see the module docstring. Raises ValueError on bad options."""
    _check_options(topology, agents, sessions, block_size, mean_requests, concurrency,
                   anchor_tokens, max_context_tokens, think_ms, tenants, session_affinity)
    specs = make_agents(topology, agents, seed, anchor_tokens)
    gen = _SessionGen(topology=topology, specs=specs, P=transition_matrix(topology, agents, seed),
                      first=start_agent(topology), ids=PrefixIds(), seed=seed,
                      block_size=block_size, mean_requests=mean_requests,
                      max_context_tokens=max_context_tokens, think_ms=think_ms,
                      tenants=tenants, session_affinity=session_affinity)
    events: list[_Event] = []
    durations: list[float] = []
    for s in range(sessions):
        durations.append(gen.session(s, events))
    records = _place(events, durations, sessions, concurrency, seed)
    header = TraceHeader(
        block_size=block_size, source=f"anchorage trace generate --topology {topology}",
        has_header=True,
        extra={"generator": {
            "topology": topology, "agents": agents, "sessions": sessions, "seed": seed,
            "mean_requests": mean_requests, "concurrency": concurrency,
            "anchor_tokens": anchor_tokens, "max_context_tokens": max_context_tokens,
            "think_ms": think_ms, "tenants": tenants, "session_affinity": session_affinity,
            "agent_names": [a.name for a in specs]}})
    assert header.format == FORMAT
    return header, records


def _check_options(topology: str, agents: int, sessions: int, block_size: int,
                   mean_requests: float, concurrency: float, anchor_tokens: int,
                   max_context_tokens: int, think_ms: float, tenants: int,
                   session_affinity: float) -> None:
    _check_topology(topology, agents)
    for name, v in (("sessions", sessions), ("block_size", block_size),
                    ("anchor_tokens", anchor_tokens), ("max_context_tokens", max_context_tokens)):
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not mean_requests >= 2:
        raise ValueError(f"mean_requests must be >= 2, got {mean_requests!r}")
    if not concurrency > 0 or not think_ms >= 0 or tenants < 0 or not session_affinity >= 1:
        raise ValueError("concurrency must be > 0, think_ms >= 0, tenants >= 0 and "
                         "session_affinity >= 1")
    if max_context_tokens < 8000 + 2000:
        raise ValueError("max_context_tokens must be >= 10000 (anchors reach 8000 tokens)")


@dataclass
class _SessionGen:
    """One session at a time: its requests as events at session-relative times."""

    topology: str
    specs: list[AgentSpec]
    P: list[list[float]]
    first: int | None
    ids: PrefixIds
    seed: int
    block_size: int
    mean_requests: float
    max_context_tokens: int
    think_ms: float
    tenants: int
    session_affinity: float

    def __post_init__(self) -> None:
        hier = self.topology == "hierarchical"
        self.lead_of = {i: 1 + int(a.name[6:].split(".")[0])
                        for i, a in enumerate(self.specs) if a.name.startswith("worker") and hier}

    def session(self, s: int, events: list[_Event]) -> float:
        """Append session ``s``'s events; returns its duration (ms)."""
        rng = random.Random(f"anchorage-session:{self.seed}:{s}")
        m = self.mean_requests
        n_req = 2 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / (m - 1))) \
            if m > 2 else 2
        n_req = min(n_req, 400)
        task_tokens = int(min(4000, max(20, _lognormal(rng, 250, 0.6))))
        tenant = f"tenant{rng.randrange(self.tenants)}" if self.tenants else None
        Ps = session_transitions(self.P, self.topology, rng, self.session_affinity)
        sid = f"s{s:05d}"
        # history segments: (key, tokens, visible_to or None for everyone)
        self.segments: list[tuple[Any, int, frozenset | None]] = []
        self.epoch = 0
        chains: dict[int, _PromptChain] = {}
        cur = self.first if self.first is not None else rng.randrange(len(self.specs))
        t = 0.0
        for step in range(n_req):
            spec = self.specs[cur]
            pc = self._prompt(chains, cur, s, task_tokens)
            out_len = int(min(4000, max(1, _lognormal(rng, spec.output_median, 0.6))))
            if pc.tokens + out_len > self.max_context_tokens:  # compact the session's history
                pc = self._compact(chains, cur, s, task_tokens, rng)
            hash_ids = pc.hash_ids(self.ids, self.block_size)
            vis = frozenset((cur, self.lead_of[cur])) if cur in self.lead_of else None
            self.segments.append((("out", s, step), out_len, vis))
            rec: dict[str, Any] = {"input_length": pc.tokens, "output_length": out_len,
                                   "hash_ids": hash_ids, "session_id": sid,
                                   "agent": spec.name, "tenant": tenant}
            done = t + service_ms(pc.tokens, out_len)
            gap, nxt = self._next(rng, spec, cur, Ps, s, step, vis, rec)
            events.append(_Event(t, s, step, rec))
            t = done + gap
            cur = nxt
        return t

    def _prompt(self, chains: dict, cur: int, s: int, task_tokens: int) -> _PromptChain:
        """Agent ``cur``'s prompt chain, extended by the history it can see."""
        spec = self.specs[cur]
        pc = chains.get(cur)
        if pc is None or pc.epoch != self.epoch:
            pc = chains[cur] = _PromptChain(self.epoch)
            pc.append(("anchor", spec.name), spec.anchor_tokens)
            pc.append(("task", s), task_tokens)
        for key, tok, vis in self.segments[pc.seen:]:
            if vis is None or cur in vis:
                pc.append(key, tok)
        pc.seen = len(self.segments)
        return pc

    def _compact(self, chains: dict, cur: int, s: int, task_tokens: int,
                 rng: random.Random) -> _PromptChain:
        """The history becomes one summary segment; a new epoch of prompt chains."""
        spec = self.specs[cur]
        self.epoch += 1
        self.segments = [(("summary", s, self.epoch), int(_lognormal(rng, 1000, 0.3)), None)]
        pc = chains[cur] = _PromptChain(self.epoch)
        pc.append(("anchor", spec.name), spec.anchor_tokens)
        pc.append(("task", s), task_tokens)
        pc.append(*self.segments[0][:2])
        pc.seen = 1
        return pc

    def _next(self, rng: random.Random, spec: AgentSpec, cur: int, Ps: list[list[float]],
              s: int, step: int, vis: frozenset | None, rec: dict) -> tuple[float, int]:
        """A tool call (same agent after its duration) or a hand-off after a think gap."""
        if rng.random() < spec.tool_prob:
            tool = rng.choice(spec.tools)
            classes = TOOLS[tool]
            ac = classes[_draw(rng, [c.weight for c in classes])]
            dur = round(_lognormal(rng, ac.median_ms, ac.sigma), 1)
            self.segments.append((("tool", s, step),
                                  int(max(5, _lognormal(rng, ac.result_tokens, 0.5))), vis))
            rec.update(tool_name=tool, tool_args=ac.args(rng), tool_duration_ms=dur)
            return dur, cur
        gap = _lognormal(rng, self.think_ms, 0.8) if self.think_ms > 0 else 0.0
        return gap, _draw(rng, Ps[cur])


def _place(events: list[_Event], durations: list[float], sessions: int, concurrency: float,
           seed: int) -> list[TraceRecord]:
    """Poisson session arrivals sized so that about ``concurrency`` sessions overlap; the
    records in time order with hash ids renumbered densely."""
    mean_dur = sum(durations) / len(durations)
    rate_per_ms = concurrency / max(mean_dur, 1.0)
    arr = random.Random(f"anchorage-arrivals:{seed}")
    starts, clock = [], 0.0
    for _ in range(sessions):
        starts.append(clock)
        clock += arr.expovariate(rate_per_ms)
    events.sort(key=lambda e: (starts[e.session] + e.t_ms, e.session, e.step))
    renum: dict[int, int] = {}
    records = []
    for e in events:
        r = e.rec
        hids = [renum.setdefault(h, len(renum)) for h in r.pop("hash_ids")]
        records.append(TraceRecord(timestamp=round(starts[e.session] + e.t_ms, 3),
                                   hash_ids=hids, **r))
    return records
