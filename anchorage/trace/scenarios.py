"""A second multi-agent workload generator, written apart from ``generate.py``: the
held-out workloads of the routing protocol (``anchorage.routing.protocol``).

``generate.py`` is the generator every parameter of the project was tuned on. Its model
of a prompt is one shape: ``anchor(agent) + task + shared history``, one session id per
task. Real agent frameworks build prompts in other shapes, so a router tuned there can
fail here. This module draws each workload's parameters from ranges (seeded) and builds
prompts the way frameworks do:

Specification
-------------
``scenario(topology, sessions, seed, *, block_size=16, concurrency=32) -> (TraceHeader,
[TraceRecord])``, pure and deterministic for its arguments. Parameters drawn per
``(topology, seed)`` from ``RANGES`` (``draw_params``): number of agents, a *preamble*
shared by every agent of the application (0 tokens in a third of the draws, else 200-3,000:
framework boilerplate and a common tool list, which makes the agents' first blocks equal),
each agent's own instructions (lognormal median 300-4,000 tokens), task length, turns,
tool-call probability and tool durations (median 50 ms - 20 s), output lengths.

An agent's *anchor* is ``preamble + instructions(agent)``. Prompts, by topology:

- ``hierarchical``: a manager delegates sub-tasks; each delegation is a worker run with its
  **own session id** (``<session>/w<k>``): ``anchor(worker) + sub-task (the manager's output)
  + the worker's own tool turns``; its report is appended to the manager's history. Manager
  prompt: ``anchor(manager) + task + manager history``.
- ``handoff`` (OpenAI Agents SDK style): triage and specialists; a hand-off passes the
  **whole conversation** to the next agent: ``anchor(agent) + task + conversation``.
- ``pipeline``: stages in order, each a run with its own session id; stage ``i`` sees
  ``anchor(stage i) + task + artifact(stage i-1)`` and its own tool turns; the last stage may
  send the work back for a revision round.
- ``debate``: debaters and a judge read one transcript: ``anchor + topic + transcript``.
- ``fanout`` (map-reduce): a planner splits the task into 2-8 shards run **at once**, each
  a worker session ``anchor(worker) + task + shard``; a reducer reads every worker output.
- ``reflection``: an actor and a critic: the critic sees ``anchor(critic) + task + the
  actor's latest draft``; the actor's history grows by drafts and critiques.
- ``subagent`` (coding-agent style): one main agent with tool calls that now and then spawns
  a sub-agent of one of 2-4 types in its own session (``anchor(type) + brief``); the
  sub-agent's result joins the main history.
- ``blackboard``: agents in random order read and write one board: ``anchor + task + board``.

Times: a request holds the engine ``30 ms + input / 10 + output x 15 ms`` (the estimate of
``generate.service_ms``); the next request of a run follows after its tool's duration or a
think time (lognormal, median 0.5 s); runs started at once (fan-out) overlap. Sessions
(top-level tasks) arrive as a Poisson process sized so that about ``concurrency`` run at
once. Records carry ``agent`` (ground truth, never read by a policy), ``session_id``,
``tool_name``/``tool_duration_ms``; block ids are chained prefix ids (``PrefixIds``) over
block contents, renumbered by first appearance.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from anchorage.trace.blocks import PrefixIds
from anchorage.trace.format import TraceHeader, TraceRecord
from anchorage.trace.generate import _PromptChain

TOPOLOGIES = ("hierarchical", "handoff", "pipeline", "debate", "fanout", "reflection",
              "subagent", "blackboard")
#: the topologies where one agent hands its work to another agent's prompt
HANDING = ("hierarchical", "handoff", "pipeline", "fanout", "subagent")

#: ranges the per-workload parameters are drawn from (uniform unless noted)
RANGES = {
    "agents": (3, 12),
    "preamble_tokens": (200, 3000),       # a third of the draws: 0
    "instructions_median": (300, 4000),   # per agent: lognormal around it, sigma 0.5
    "task_tokens": (100, 1500),
    "turns": (3, 12),                     # mean turns of a run
    "tool_prob": (0.1, 0.6),
    "tool_median_s": (0.05, 20.0),        # log-uniform
    "output_median": (60, 500),
}


@dataclass(frozen=True)
class ScenarioParams:
    agents: int
    preamble_tokens: int
    instructions: tuple[int, ...]
    task_tokens: int
    turns: float
    tool_prob: float
    tool_median_s: float
    output_median: int


def draw_params(topology: str, seed: int) -> ScenarioParams:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown scenario topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    rng = random.Random(f"anchorage-scenario-params:{topology}:{seed}")
    lo, hi = RANGES["agents"]
    agents = rng.randint(lo, hi)
    pre = 0 if rng.random() < 1 / 3 else rng.randint(*RANGES["preamble_tokens"])
    med = rng.uniform(*RANGES["instructions_median"])
    instr = tuple(int(min(8000, max(100, rng.lognormvariate(math.log(med), 0.5))))
                  for _ in range(agents))
    t_lo, t_hi = RANGES["tool_median_s"]
    return ScenarioParams(
        agents=agents, preamble_tokens=pre, instructions=instr,
        task_tokens=rng.randint(*RANGES["task_tokens"]), turns=rng.uniform(*RANGES["turns"]),
        tool_prob=rng.uniform(*RANGES["tool_prob"]),
        tool_median_s=math.exp(rng.uniform(math.log(t_lo), math.log(t_hi))),
        output_median=rng.randint(*RANGES["output_median"]))


class _Prompt(_PromptChain):
    """An append-only prompt (the generator's chain of segments and incremental block ids:
    the mechanism is shared, the prompt shapes are this module's)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(0)

    def add(self, key: Any, tokens: int) -> "_Prompt":
        self.append(key, tokens)
        return self


class _Builder:
    def __init__(self, topology: str, p: ScenarioParams, seed: int, bs: int) -> None:
        self.topology, self.p, self.bs = topology, p, bs
        self.ids = PrefixIds()
        self.events: list[tuple[float, int, dict]] = []   # (time ms, order, record)
        self.seed = seed
        self._n = 0

    def anchor(self, agent: int) -> _Prompt:
        return _Prompt().add(("preamble",), self.p.preamble_tokens).add(
            ("instr", agent), self.p.instructions[agent])

    def out_len(self, rng: random.Random) -> int:
        return int(min(3000, max(1, rng.lognormvariate(math.log(self.p.output_median), 0.6))))

    def turn(self, rng: random.Random, t: float, prompt: _Prompt, sid: str, agent: int,
             tool: bool | None = None) -> tuple[float, int]:
        """Emit one request at ``t``; returns (time its follower may start, output len)."""
        out = self.out_len(rng)
        use_tool = rng.random() < self.p.tool_prob if tool is None else tool
        rec: dict[str, Any] = {"input_length": prompt.tokens, "output_length": out,
                               "hash_ids": prompt.hash_ids(self.ids, self.bs),
                               "session_id": sid, "agent": f"agent{agent}"}
        done = t + 30.0 + prompt.tokens / 10.0 + out * 15.0
        if use_tool:
            dur = rng.lognormvariate(math.log(self.p.tool_median_s * 1000.0), 0.8)
            rec.update(tool_name=f"tool{agent % 4}", tool_duration_ms=round(dur, 1))
            gap = dur
        else:
            gap = rng.lognormvariate(math.log(500.0), 0.7)
        self._n += 1
        self.events.append((t, self._n, rec))
        return done + gap, out

    def run(self, rng: random.Random, t: float, prompt: _Prompt, sid: str, agent: int,
            turns: int, key: Any) -> tuple[float, int]:
        """A run of ``turns`` requests of one agent: tool turns grow its own history; the
        last turn answers. Returns (end time, output tokens of the answer)."""
        out = 0
        for k in range(turns):
            last = k == turns - 1
            t, out = self.turn(rng, t, prompt, sid, agent, tool=False if last else None)
            if not last:
                prompt.add((key, "out", k), out).add((key, "res", k),
                                                     int(rng.lognormvariate(math.log(400), 0.7)))
        return t, out

    def n_turns(self, rng: random.Random, scale: float = 1.0) -> int:
        m = max(2.0, self.p.turns * scale)
        return max(1, min(60, int(rng.expovariate(1.0 / m)) + 1))


def _session(b: _Builder, s: int, t0: float) -> float:
    """Build session ``s`` starting at ``t0``; returns its end time (ms)."""
    p, topo = b.p, b.topology
    rng = random.Random(f"anchorage-scenario:{topo}:{b.seed}:{s}")
    sid = f"s{s:05d}"
    task = (("task", s), p.task_tokens + rng.randint(0, p.task_tokens))
    n = p.agents
    t = t0
    if topo == "hierarchical":
        mgr = b.anchor(0).add(*task)
        for k in range(max(1, b.n_turns(rng, 0.4))):
            t, out = b.turn(rng, t, mgr, sid, 0, tool=False)
            mgr.add(("mgr", s, k), out)
            w = 1 + rng.randrange(n - 1)
            wp = b.anchor(w).add(("brief", s, k), out)
            t, rep = b.run(rng, t, wp, f"{sid}/w{k}", w, b.n_turns(rng, 0.5), ("w", s, k))
            mgr.add(("report", s, k), rep)
        t, _ = b.turn(rng, t, mgr, sid, 0, tool=False)
    elif topo in ("handoff", "debate", "blackboard"):
        convo: list[tuple[Any, int]] = []
        prompts: dict[int, _Prompt] = {}       # each agent's view extends its last one
        cur = 0
        for k in range(b.n_turns(rng, 1.5)):
            pr = prompts.get(cur)
            if pr is None:
                pr = prompts[cur] = b.anchor(cur).add(*task)
            for seg in convo[pr.seen:]:
                pr.add(*seg)
            pr.seen = len(convo)
            t, out = b.turn(rng, t, pr, sid, cur)
            convo.append((("msg", s, k), out))
            if topo == "handoff":
                if rng.random() < 0.3:      # the agent ran a tool or asked the user: it stays
                    convo.append((("res", s, k), int(rng.lognormvariate(math.log(300), 0.7))))
                else:
                    cur = 0 if cur != 0 and rng.random() < 0.3 else 1 + rng.randrange(n - 1)
            elif topo == "debate":
                cur = (cur + 1) % n          # agent n-1 is the judge; it restarts the round
            else:
                cur = rng.randrange(n)
    elif topo == "pipeline":
        art: tuple[Any, int] = task
        rounds = 1 + (rng.random() < 0.4)
        for r in range(rounds):
            for st in range(n):
                pr = b.anchor(st).add(*task)
                if art is not task:
                    pr.add(*art)
                t, out = b.run(rng, t, pr, f"{sid}/p{r}.{st}", st, b.n_turns(rng, 0.4),
                               ("st", s, r, st))
                art = (("art", s, r, st), out * 2)
    elif topo == "fanout":
        t, out = b.turn(rng, t, b.anchor(0).add(*task), sid, 0, tool=False)
        ends, outs = [], []
        for w in range(rng.randint(2, 8)):
            agent = 1 + (w % max(1, n - 2))
            wp = b.anchor(agent).add(*task).add(("shard", s, w), out // 2 + 50)
            e, o = b.run(rng, t, wp, f"{sid}/m{w}", agent, b.n_turns(rng, 0.3), ("m", s, w))
            ends.append(e)
            outs.append(o)
        red = b.anchor(n - 1).add(*task)
        for w, o in enumerate(outs):
            red.add(("mapped", s, w), o)
        t, _ = b.turn(rng, max(ends), red, sid, n - 1, tool=False)
    elif topo == "reflection":
        actor = b.anchor(0).add(*task)
        for k in range(max(1, b.n_turns(rng, 0.5))):
            t, draft = b.turn(rng, t, actor, sid, 0)
            actor.add(("draft", s, k), draft)
            critic = b.anchor(1).add(*task).add(("draft", s, k), draft)
            t, crit = b.turn(rng, t, critic, sid, 1, tool=False)
            actor.add(("crit", s, k), crit)
    else:  # subagent
        main = b.anchor(0).add(*task)
        types = max(1, min(4, n - 1))
        for k in range(b.n_turns(rng, 1.5)):
            t, out = b.turn(rng, t, main, sid, 0)
            main.add(("main", s, k), out)
            if rng.random() < 0.2:
                a = 1 + rng.randrange(types)
                sp = b.anchor(a).add(("brief", s, k), min(out, 600) + 100)
                t, res = b.run(rng, t, sp, f"{sid}/a{k}", a, b.n_turns(rng, 0.6), ("a", s, k))
                main.add(("subres", s, k), res)
            else:
                main.add(("res", s, k), int(rng.lognormvariate(math.log(400), 0.7)))
    return t


def scenario(topology: str, sessions: int, seed: int, *, block_size: int = 16,
             concurrency: float = 32.0) -> tuple[TraceHeader, list[TraceRecord]]:
    """A held-out workload (module docstring). ValueError on bad options."""
    if sessions < 1 or block_size < 1 or not concurrency > 0:
        raise ValueError("sessions >= 1, block_size >= 1 and concurrency > 0 required")
    p = draw_params(topology, seed)
    if topology in ("debate", "reflection") and p.agents < 2:
        raise ValueError("needs 2 agents")
    # durations first (a dry run per session at t=0) to size the arrival rate
    dry = _Builder(topology, p, seed, block_size)
    mean = sum(_session(dry, s, 0.0) for s in range(min(sessions, 50))) / min(sessions, 50)
    rate = concurrency / max(mean, 1.0)
    arr = random.Random(f"anchorage-scenario-arrivals:{topology}:{seed}")
    b = _Builder(topology, p, seed, block_size)
    t0 = 0.0
    for s in range(sessions):
        _session(b, s, t0)
        t0 += arr.expovariate(rate)
    b.events.sort(key=lambda e: (e[0], e[1]))
    renum: dict[int, int] = {}
    out = []
    for t, _, rec in b.events:
        rec["hash_ids"] = [renum.setdefault(h, len(renum)) for h in rec["hash_ids"]]
        out.append(TraceRecord(timestamp=round(t, 3), **rec))
    header = TraceHeader(block_size=block_size, source=f"anchorage.trace.scenarios {topology}",
                         has_header=True,
                         extra={"scenario": {"topology": topology, "seed": seed,
                                             "sessions": sessions, "concurrency": concurrency,
                                             **{k: getattr(p, k) for k in
                                                ("agents", "preamble_tokens", "task_tokens",
                                                 "turns", "tool_prob", "tool_median_s",
                                                 "output_median")}}})
    return header, out
