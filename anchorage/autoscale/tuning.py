"""Tuning by digital twin: replay a sampled access log under candidate parameters.

Specification. Inputs: request contexts from the node agents' sampled access logs
(anchorage-trace/v1), the KV capacity of one replica in blocks, the policy name, the
parameters in force (flat names, see ``params``), the tunable ranges
(``spec.tuning.parameters``: name, min, max, steps) and ``minImprovement``.

1. Candidates: each range gives ``steps`` evenly spaced values in [min, max]. When the full
   grid has at most ``MAX_GRID`` points every combination is a candidate; otherwise each
   parameter is swept alone around the parameters in force (coordinate search).
2. Score: the block-weighted hit rate of a sequential replay (objective ``hitRate``), or the
   token hit rate, i.e. 1 - recomputed-token fraction (objective ``recomputedTokens``).
   Both are fractions, so ``minImprovement`` is an absolute difference.
3. Adopt the best candidate only if score(best) > score(in force) + minImprovement
   (ties go to the earlier candidate, so the result is deterministic). Otherwise keep the
   parameters in force; the outcome says why either way.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from anchorage.autoscale.params import policy_kwargs
from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.sim.replay import replay

MAX_GRID = 64


@dataclass(frozen=True)
class ParameterRange:
    name: str
    min: float
    max: float
    steps: int = 5

    @classmethod
    def from_spec(cls, d: dict[str, Any]) -> "ParameterRange":
        return cls(name=d["name"], min=float(d["min"]), max=float(d["max"]),
                   steps=int(d.get("steps", 5)))

    def problems(self) -> list[str]:
        out = []
        if self.min > self.max:
            out.append(f"tuning parameter {self.name}: min {self.min:g} > max {self.max:g}")
        if self.steps < 2:
            out.append(f"tuning parameter {self.name}: steps must be at least 2")
        return out

    def values(self) -> list[float]:
        if self.steps < 2 or self.max == self.min:
            return [self.min]
        step = (self.max - self.min) / (self.steps - 1)
        return [round(self.min + i * step, 12) for i in range(self.steps)]


def candidate_grid(current: dict[str, Any], ranges: Sequence[ParameterRange]) -> list[dict[str, Any]]:
    """Candidate parameter sets (each a full flat dict), the parameters in force excluded."""
    if not ranges:
        return []
    axes = [r.values() for r in ranges]
    size = 1
    for a in axes:
        size *= len(a)
    out: list[dict[str, Any]] = []
    if size <= MAX_GRID:
        for combo in itertools.product(*axes):
            cand = dict(current)
            cand.update({r.name: v for r, v in zip(ranges, combo)})
            out.append(cand)
    else:
        for r, axis in zip(ranges, axes):
            for v in axis:
                cand = dict(current)
                cand[r.name] = v
                out.append(cand)
    seen, unique = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if c != current and key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


@dataclass(frozen=True)
class TuningOutcome:
    adopt: bool
    parameters: dict[str, Any]          # the parameters to run with after this decision
    current_score: float
    best_score: float
    reason: str
    scores: list[tuple[dict[str, Any], float]] = field(default_factory=list)


def choose_candidate(current: dict[str, Any], current_score: float,
                     scored: Sequence[tuple[dict[str, Any], float]],
                     min_improvement: float) -> TuningOutcome:
    """The adoption rule (step 3): pure."""
    if not scored:
        return TuningOutcome(False, dict(current), current_score, current_score,
                             "no candidates to evaluate", [])
    best, best_score = scored[0]
    for cand, s in scored[1:]:
        if s > best_score:
            best, best_score = cand, s
    gain = best_score - current_score
    if gain > min_improvement:
        changed = {k: v for k, v in best.items() if current.get(k) != v}
        return TuningOutcome(True, dict(best), current_score, best_score,
                             f"adopted {_fmt(changed)}: score {current_score:.4f} -> "
                             f"{best_score:.4f} (+{gain:.4f} > {min_improvement:g})", list(scored))
    return TuningOutcome(False, dict(current), current_score, best_score,
                         f"kept parameters in force: best candidate {_fmt(best)} scores "
                         f"{best_score:.4f} vs {current_score:.4f} (gain {gain:+.4f} <= "
                         f"{min_improvement:g})", list(scored))


def _fmt(p: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in sorted(p.items())) + "}"


PolicyFactory = Callable[..., Any]


def score_parameters(contexts: Sequence[RequestContext], capacity_blocks: int, block_size: int,
                     policy: str, flat_params: dict[str, Any], objective: str = "hitRate",
                     factory: PolicyFactory = make_policy) -> float:
    """Replay ``contexts`` with the policy built from ``flat_params``; higher is better."""
    kwargs = policy_kwargs(flat_params)
    try:
        pol = factory(policy, block_size=block_size, params=kwargs)
    except TypeError as e:
        raise ValueError(f"policy {policy!r} does not accept parameters "
                         f"{sorted(kwargs)}: {e}") from None
    res = replay(contexts, capacity_blocks, block_size, pol)
    if objective == "hitRate":
        return res.hit_rate
    if objective == "recomputedTokens":
        return res.token_hit_rate
    raise ValueError(f"unknown tuning objective {objective!r} (hitRate or recomputedTokens)")


def tune(contexts: Sequence[RequestContext], *, capacity_blocks: int, block_size: int,
         policy: str, current: dict[str, Any], ranges: Sequence[ParameterRange],
         min_improvement: float, objective: str = "hitRate",
         factory: PolicyFactory = make_policy) -> TuningOutcome:
    """Score the parameters in force and every candidate, then apply the adoption rule."""
    if not contexts:
        return TuningOutcome(False, dict(current), 0.0, 0.0, "access log is empty", [])
    base = score_parameters(contexts, capacity_blocks, block_size, policy, current,
                            objective, factory)
    scored = [(c, score_parameters(contexts, capacity_blocks, block_size, policy, c,
                                   objective, factory))
              for c in candidate_grid(current, ranges)]
    return choose_candidate(current, base, scored, min_improvement)
