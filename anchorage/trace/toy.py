"""A small multi-agent workload with known structure, as request contexts (unit tests and
micro-benchmarks; `anchorage.trace.generate` is the realistic generator).

Specification
-------------
``toy_multiagent(topology, seed, **opts) -> [RequestContext]`` is deterministic for a seed
(block keys are hashes of labels: equal keys mean equal prefixes, the values themselves
differ between processes):

* ``agents`` agents, each with an anchor of ``anchor_blocks`` blocks: 2 preamble blocks
  shared by every agent, then its own.
* ``sessions`` sessions start at uniform times in [0, ``horizon_s``); each walks
  ``steps`` steps over the agents: ``pipeline`` 0 -> 1 -> ... (wrapping), ``selector`` a
  hub (agent 0) picks a worker uniformly and every worker returns to the hub, ``random``
  (or any other name) a uniform draw. A session starts at agent 0, or at a random agent
  when ``random_start`` (default: only for ``random``).
* Every agent keeps its own thread of the session: its prompt is its anchor plus
  ``turn_blocks`` new blocks per step it has taken in the session, chained after the
  anchor; ``input_length`` = blocks x ``block_size``, ``output_length`` fixed.
* Each step draws a tool from ``tool_gaps`` (name -> gap scale in seconds, drawn in the
  dict's order) when ``tools``; the next step follows after ``gap_base_s`` +
  lognormal(0, ``gap_sigma``) x scale (``default_gap_s`` without a tool).
  ``tool_paths`` adds ``tool_args = {"path": "f<agent>.py"}``.
* Requests are ordered by time (then session); ``agent_truth`` is ``a<agent>``.
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Mapping

from anchorage.policies.base import RequestContext

BENCH_TOOL_GAPS = {"read": 0.5, "grep": 1.0, "test": 20.0, "build": 60.0}


def _chain(prev: int, item: Any) -> int:
    return hash((prev, item)) & ((1 << 62) - 1)


def _anchors(agents: int, anchor_blocks: int) -> list[list[int]]:
    out = []
    for a in range(agents):
        k, chain = 0, []
        for i in range(anchor_blocks):
            k = _chain(k, ("pre", i) if i < 2 else ("anchor", a, i))
            chain.append(k)
        out.append(chain)
    return out


def toy_multiagent(topology: str = "pipeline", seed: int = 0, *, agents: int = 8,
                   sessions: int = 200, steps: int = 10, horizon_s: float = 3600.0,
                   anchor_blocks: int = 24, turn_blocks: int = 6, block_size: int = 16,
                   tools: bool = True, tool_gaps: Mapping[str, float] = BENCH_TOOL_GAPS,
                   gap_base_s: float = 2.0, gap_sigma: float = 0.5, default_gap_s: float = 5.0,
                   random_start: bool | None = None, output_length: int = 64,
                   tool_paths: bool = False) -> list[RequestContext]:
    """The workload of the module docstring; the defaults are the benchmarks' (hot path
    and state size in ``bench/bench_policies.py``)."""
    rng = random.Random(seed)
    names = list(tool_gaps)
    anchors = _anchors(agents, anchor_blocks)
    if random_start is None:
        random_start = topology == "random"

    def nxt(a: int) -> int:
        if topology == "pipeline":
            return (a + 1) % agents
        if topology == "selector":
            return rng.randrange(1, agents) if a == 0 else 0
        return rng.randrange(agents)

    events = []
    for s in range(sessions):
        t = rng.uniform(0, horizon_s)
        a = rng.randrange(agents) if random_start else 0
        threads: dict[int, list[int]] = {}
        for step in range(steps):
            th = threads.setdefault(a, list(anchors[a]))
            k = th[-1]
            for i in range(turn_blocks):
                k = _chain(k, ("turn", s, step, i))
                th.append(k)
            tool = rng.choice(names) if tools else None
            events.append((t, s, a, list(th), tool))
            t += gap_base_s + rng.lognormvariate(0, gap_sigma) * (
                tool_gaps[tool] if tool else default_gap_s)
            a = nxt(a)
    events.sort(key=lambda e: (e[0], e[1]))
    return [RequestContext(request_id=i, keys=keys, input_length=len(keys) * block_size,
                           output_length=output_length, now_s=t, session_id=f"s{s}",
                           tool_name=tool,
                           tool_args={"path": f"f{a}.py"} if tool and tool_paths else None,
                           seq=i, agent_truth=f"a{a}")
            for i, (t, s, a, keys, tool) in enumerate(events)]


def unique_blocks(contexts: Iterable[RequestContext]) -> int:
    seen: set = set()
    for c in contexts:
        seen.update(c.keys)
    return len(seen)
