"""A tiny multi-agent workload with known structure, for the agent-aware policy tests."""

from __future__ import annotations

import random

from anchorage.policies.base import RequestContext


def _chain(prev: int, item) -> int:
    return hash((prev, item)) & ((1 << 62) - 1)


def pipeline_workload(seed: int = 0, agents: int = 4, sessions: int = 30, steps: int = 8,
                      horizon_s: float = 600.0, anchor_blocks: int = 8, turn_blocks: int = 3,
                      block_size: int = 16, tools: bool = True, output_length: int = 32,
                      topology: str = "pipeline") -> list[RequestContext]:
    """Sessions walk agents (pipeline: 0 -> 1 -> ...; random: uniform). Each agent's
    prompt is its anchor (2 shared preamble blocks + its own) then its thread of the
    session. Gaps depend on the tool: ``read`` short, ``test`` long."""
    rng = random.Random(seed)
    tool_s = {"read": 0.5, "test": 30.0}
    anchors = []
    for a in range(agents):
        k, ch = 0, []
        for i in range(anchor_blocks):
            k = _chain(k, ("pre", i) if i < 2 else ("anchor", a, i))
            ch.append(k)
        anchors.append(ch)
    evs = []
    for s in range(sessions):
        t = rng.uniform(0, horizon_s)
        a = rng.randrange(agents)
        threads: dict[int, list[int]] = {}
        for step in range(steps):
            th = threads.setdefault(a, list(anchors[a]))
            k = th[-1]
            for i in range(turn_blocks):
                k = _chain(k, ("turn", s, step, i))
                th.append(k)
            tool = rng.choice(sorted(tool_s)) if tools else None
            evs.append((t, s, a, list(th), tool))
            t += 1.0 + rng.lognormvariate(0, 0.3) * (tool_s[tool] if tool else 5.0)
            a = (a + 1) % agents if topology == "pipeline" else rng.randrange(agents)
    evs.sort(key=lambda e: (e[0], e[1]))
    return [RequestContext(request_id=i, keys=keys, input_length=len(keys) * block_size,
                           output_length=output_length, now_s=t, session_id=f"s{s}",
                           tool_name=tool, tool_args={"path": f"f{a}.py"} if tool else None,
                           seq=i, agent_truth=f"a{a}")
            for i, (t, s, a, keys, tool) in enumerate(evs)]


def unique_blocks(ctxs) -> int:
    seen = set()
    for c in ctxs:
        seen.update(c.keys)
    return len(seen)
