"""Agent topologies of the synthetic workload generator: agent names and the transition
matrices between them (``anchorage.trace.generate``'s module docstring specifies each
topology; this module implements that part of it).

- ``agent_names(topology, agents)``: the agents' names, by role.
- ``transition_matrix(topology, agents, seed)``: row-stochastic ``P[i][j]`` = P(next agent
  j | agent i, no tool call); one builder per topology, rows normalised.
- ``session_transitions(P, topology, rng, affinity)``: one session's matrix, favouring two
  agents by ``affinity``.
- ``start_agent(topology)``: the agent every session starts with (None: a random one).
"""

from __future__ import annotations

import math
import random

TOPOLOGIES = ("pipeline", "debate", "selector", "hierarchical", "handoff", "random")


def agent_names(topology: str, agents: int) -> list[str]:
    _check_topology(topology, agents)
    n = agents
    if topology == "pipeline":
        return [f"stage{i}" for i in range(n)]
    if topology == "debate":
        return [f"debater{i}" for i in range(n - 1)] + ["judge"]
    if topology == "selector":
        return ["selector"] + [f"worker{i}" for i in range(n - 1)]
    if topology == "hierarchical":
        leads = _n_leads(n)
        names = ["manager"] + [f"lead{j}" for j in range(leads)]
        for i in range(n - 1 - leads):
            names.append(f"worker{i % leads}.{i // leads}")
        return names
    if topology == "handoff":
        return ["triage"] + [f"specialist{i}" for i in range(n - 1)]
    return [f"agent{i}" for i in range(n)]


def _n_leads(n: int) -> int:
    return max(1, round(math.sqrt(n - 1) / 1.5)) if n > 2 else 1


def _check_topology(topology: str, agents: int) -> None:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")
    least = 3 if topology == "hierarchical" else 2
    if agents < least:
        raise ValueError(f"topology {topology} needs at least {least} agents, got {agents}")


def _zipf(n: int, s: float = 1.0) -> list[float]:
    w = [1.0 / (i + 1) ** s for i in range(n)]
    tot = sum(w)
    return [x / tot for x in w]


def _spread(row: list[float], idx: list[int], mass: float) -> None:
    for j in idx:
        row[j] += mass / len(idx)


def _pipeline(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    n = len(P)
    for i in range(n):
        if i < n - 1:
            P[i][i + 1] += 0.85
            P[i][i - 1 if i > 0 else i] += 0.10
            P[i][i] += 0.05
        else:
            P[i][0] += 0.7
            P[i][i - 1] += 0.3


def _debate(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    n = len(P)
    d = n - 1
    for i in range(d):
        nxt = i + 1 if i < d - 1 else n - 1
        others = [j for j in range(d) if j != i] or [n - 1]
        if i < d - 1:
            P[i][nxt] += 0.8
            _spread(P[i], others, 0.2)
        else:
            P[i][nxt] += 0.9
            _spread(P[i], others, 0.1)
    P[n - 1][0] += 0.9
    _spread(P[n - 1], list(range(d)), 0.1)


def _selector(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    n = len(P)
    for j, w in enumerate(_zipf(n - 1)):
        P[0][j + 1] = w
    for i in range(1, n):
        P[i][0] = 0.9
        P[i][i] = 0.1


def _hierarchical(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    leads = _n_leads(len(P))
    team: dict[int, list[int]] = {1 + j: [] for j in range(leads)}
    for i, name in enumerate(names):
        if name.startswith("worker"):
            team[1 + int(name[6:].split(".")[0])].append(i)
    _spread(P[0], list(team), 1.0)
    for lead, workers in team.items():
        if workers:
            _spread(P[lead], workers, 0.8)
            P[lead][0] += 0.2
        else:
            P[lead][0] += 1.0
        for w in workers:
            P[w][lead] += 0.85
            sib = [x for x in workers if x != w]
            _spread(P[w], sib or [lead], 0.15)


def _handoff(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    n = len(P)
    for j, w in enumerate(_zipf(n - 1)):
        P[0][j + 1] = w
    spec = list(range(1, n))
    for i in spec:
        others = [j for j in spec if j != i]
        if not others:
            P[i][0] = 1.0
            continue
        pref = rng.sample(others, min(2, len(others)))
        for j in pref:
            P[i][j] += 0.7 / len(pref)
        P[i][0] += 0.2
        _spread(P[i], [j for j in range(n) if j != i], 0.1)


def _random(P: list[list[float]], names: list[str], rng: random.Random) -> None:
    """Dirichlet(50) rows: near-uniform."""
    n = len(P)
    for i in range(n):
        g = [rng.gammavariate(50.0, 1.0) for _ in range(n)]
        tot = sum(g)
        P[i] = [x / tot for x in g]


_TRANSITIONS = {"pipeline": _pipeline, "debate": _debate, "selector": _selector,
                "hierarchical": _hierarchical, "handoff": _handoff}


def transition_matrix(topology: str, agents: int, seed: int = 0) -> list[list[float]]:
    """Row-stochastic matrix P[i][j] = P(next agent j | agent i, no tool call)."""
    names = agent_names(topology, agents)
    n = len(names)
    rng = random.Random(f"anchorage-topology:{topology}:{agents}:{seed}")
    P = [[0.0] * n for _ in range(n)]
    _TRANSITIONS.get(topology, _random)(P, names, rng)
    for row in P:
        tot = sum(row)
        row[:] = [x / tot for x in row]
    return P


def session_transitions(P: list[list[float]], topology: str, rng: random.Random,
                        affinity: float) -> list[list[float]]:
    """A session's own transition matrix: the task favours two agents. In ``selector``
    (the selector's choice), ``handoff`` (every hand-off) and ``hierarchical`` (the
    manager's choice of lead), the probability of moving to a favoured agent is
    multiplied by ``affinity`` and the row renormalized; other topologies are unchanged."""
    rows = {"selector": [0], "handoff": list(range(len(P))), "hierarchical": [0]}.get(topology)
    if not rows or affinity == 1:
        return P
    cand = sorted({j for i in rows for j, p in enumerate(P[i]) if p > 0 and j != i})
    fav = set(rng.sample(cand, min(2, len(cand))))
    out = [list(r) for r in P]
    for i in rows:
        row = [p * affinity if j in fav else p for j, p in enumerate(out[i])]
        tot = sum(row)
        out[i] = [p / tot for p in row]
    return out


def start_agent(topology: str) -> int | None:
    """Index of the agent every session starts with (None: uniform)."""
    return None if topology == "random" else 0
