"""Spatial policy (TokenCake section 5): how critical each agent is, how large the reserved
block pool is, and how it is split among the critical agents. Pure functions.

Specification
-------------
Agent score ``S_a`` (``agent_scores``), a weighted sum over four dimensions, each
normalised to [0, 1] across the active agents:

- ``flow``: how much of the workflow waits on ``a``: the share of learned transitions
  that enter ``a``, ``sum_i (n_i / N) P(a | i)`` (``anchorage.policies.transitions``);
- ``queue``: ``a``'s share of the waiting requests (queueing);
- ``usage``: ``a``'s share of the GPU blocks held by running requests;
- ``active``: ``a``'s share of the sessions in flight.

``S_a = 0.4 flow + 0.3 queue + 0.15 usage + 0.15 active`` (weights ``ScoreWeights``).
An agent's criticality is ``S_a / max_b S_b`` in [0, 1] (the temporal gate's penalty).

Reserved pool (``reserved_fraction``): a feedback on GPU usage ``u`` (fraction of blocks
held): 0 below ``low`` (0.5), ``cap`` (0.3 of all blocks, the paper's cap) above ``high``
(0.9), linear in between.

Critical agents (``critical_agents``): the top ``ceil(ratio x n)`` agents by score
(``ratio`` 0.75, the paper's), ties broken by name order; agents with score 0 never.

Split (``split_reservation``): agent ``a``'s share is ``alpha x usage_a / sum usage +
(1 - alpha) x S_a / sum S`` over the critical agents (``alpha`` 0.5), turned into whole
blocks by largest remainder, so the shares sum to the reserved total; an agent with a
score but no usage still gets a share.

Admission priority (``admission_rank``): preempted requests first (vLLM puts them at the
head of the queue), then by ``arrival_s - boost_s x criticality`` (``boost_s`` 1 s): a
critical agent's request overtakes requests that arrived up to ``boost_s`` before it,
never older ones (strict priority starves the other agents' sessions:
``docs/research/tiering.md``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from anchorage.policies.transitions import TransitionLearner


@dataclass(frozen=True)
class ScoreWeights:
    flow: float = 0.4
    queue: float = 0.3
    usage: float = 0.15
    active: float = 0.15


@dataclass(frozen=True)
class SpatialParams:
    low: float = 0.5
    high: float = 0.9
    cap: float = 0.3
    ratio: float = 0.75
    alpha: float = 0.5
    boost_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high <= 1:
            raise ValueError("need 0 <= low < high <= 1")
        if not 0 <= self.cap <= 1 or not 0 < self.ratio <= 1 or not 0 <= self.alpha <= 1:
            raise ValueError("cap and alpha must be in [0, 1], ratio in (0, 1]")


def _shares(values: Mapping[Hashable, float]) -> dict[Hashable, float]:
    tot = sum(v for v in values.values() if v > 0)
    return {a: (v / tot if tot > 0 and v > 0 else 0.0) for a, v in values.items()}


def transition_flow(learner: TransitionLearner,
                    agents: Iterable[Hashable]) -> dict[Hashable, float]:
    """``sum_i (n_i / N) P(a | i)`` for each agent (0 when nothing is learned), from the
    caller's own transition learner (never an eviction policy's internals), in
    O(non-zero counts + agents): with ``P(a | i) = (C_ia + eps) / (n_i + eps A)`` the
    smoothing term is the same for every ``a``."""
    agents = list(agents)
    total = learner.total
    if total <= 0:
        return dict.fromkeys(agents, 0.0)
    n_t, eps = learner.n_targets(), learner.eps
    want = dict.fromkeys(agents, 0.0)
    base = 0.0
    for i in learner.agents:
        n_i = learner.row_total(i)
        w = n_i / total
        if w <= 0:
            continue
        d = n_i + eps * n_t
        base += w * eps / d
        for j, c in learner.row_counts(i).items():
            if j in want:
                want[j] += w * c / d
    return {a: want[a] + base for a in agents}


def agent_scores(flow: Mapping[Hashable, float], queue: Mapping[Hashable, float],
                 usage: Mapping[Hashable, float], active: Mapping[Hashable, float],
                 w: ScoreWeights = ScoreWeights()) -> dict[Hashable, float]:
    agents = set(flow) | set(queue) | set(usage) | set(active)
    f, q, u, s = (_shares({a: m.get(a, 0.0) for a in agents})
                  for m in (flow, queue, usage, active))
    return {a: w.flow * f[a] + w.queue * q[a] + w.usage * u[a] + w.active * s[a]
            for a in agents}


def criticality(scores: Mapping[Hashable, float]) -> dict[Hashable, float]:
    top = max(scores.values(), default=0.0)
    return {a: (v / top if top > 0 else 0.0) for a, v in scores.items()}


def reserved_fraction(usage: float, p: SpatialParams = SpatialParams()) -> float:
    if usage <= p.low:
        return 0.0
    if usage >= p.high:
        return p.cap
    return p.cap * (usage - p.low) / (p.high - p.low)


def critical_agents(scores: Mapping[Hashable, float],
                    p: SpatialParams = SpatialParams()) -> list[Hashable]:
    ranked = sorted((a for a, v in scores.items() if v > 0),
                    key=lambda a: (-scores[a], repr(a)))
    return ranked[:math.ceil(p.ratio * len(ranked))]


def split_reservation(total_blocks: int, critical: Iterable[Hashable],
                      usage: Mapping[Hashable, float], scores: Mapping[Hashable, float],
                      p: SpatialParams = SpatialParams()) -> dict[Hashable, int]:
    crit = list(critical)
    if total_blocks <= 0 or not crit:
        return {}
    u = _shares({a: usage.get(a, 0.0) for a in crit})
    s = _shares({a: scores.get(a, 0.0) for a in crit})
    has_u = any(u.values())
    has_s = any(s.values())
    alpha = p.alpha if (has_u and has_s) else (1.0 if has_u else 0.0)
    if not has_u and not has_s:
        s = {a: 1.0 / len(crit) for a in crit}
    want = {a: total_blocks * (alpha * u[a] + (1 - alpha) * s[a]) for a in crit}
    out = {a: math.floor(v) for a, v in want.items()}
    left = total_blocks - sum(out.values())
    for a in sorted(crit, key=lambda a: (-(want[a] - out[a]), repr(a)))[:left]:
        out[a] += 1
    return {a: n for a, n in out.items() if n > 0}


def critical_arrival(arrival_s: float, crit: float, boost_s: float = 1.0) -> float:
    """The arrival time admission orders by: ``arrival_s - boost_s x criticality`` (the
    engine's prefix-aware scheduler uses it as the request's arrival, aging included)."""
    return arrival_s - boost_s * crit


def admission_rank(preempted: bool, crit: float, arrival_s: float,
                   boost_s: float = 1.0) -> tuple[int, float]:
    """Sort key (smaller first) for the waiting queue."""
    return (0 if preempted else 1, critical_arrival(arrival_s, crit, boost_s))
