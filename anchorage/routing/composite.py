"""``composite``: routers composed from configuration, llm-d style (filter, scorers, picker).

Spec: for each request, (1) apply the filters in order to the replica positions; if a
filter would leave none, it is skipped (a saturated fleet still routes; admission control
is the caller's job). (2) Each scorer returns a score in [0, 1] per remaining replica;
``total_r = sum_s weight_s * score_s(r)``. (3) The picker chooses: ``max_score`` (highest
total, ties broken at random) or ``weighted_random`` (probability proportional to total).

Filters: ``healthy``; ``overload`` (``max_load`` 64 running+waiting, ``max_kv_usage`` 0.95).
Scorers: one per file in ``anchorage.routing.scorers`` (``queue``, ``waiting_queue``,
``kv_usage``, ``prefix``, ``precise_prefix``, ``session``, ``anchor``), each with its formula.

Configuration: ``filters`` (list of names or ``{"name": ..., **params}``; default
``["healthy", "overload"]``), ``scorers`` (``{name: weight}`` or a list of
``{"name", "weight", **params}``; default ``{"prefix": 2, "queue": 1}``), ``picker``
(``"max_score"``), ``seed`` (0).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.scorers import SCORERS, Positions, Scorer, make_scorer

__all__ = ["CompositeRouter", "FILTERS", "PICKERS", "SCORERS"]


# -- filters ------------------------------------------------------------------------------
def healthy_filter() -> Callable:
    return lambda ctx, reps, pos: [p for p in pos if reps[p].healthy]


def overload_filter(max_load: int = 64, max_kv_usage: float = 0.95) -> Callable:
    return lambda ctx, reps, pos: [p for p in pos
                                   if reps[p].load < max_load and reps[p].kv_usage < max_kv_usage]


FILTERS: dict[str, Callable[..., Callable]] = {"healthy": healthy_filter,
                                               "overload": overload_filter}


# -- pickers ------------------------------------------------------------------------------
def max_score(pos: Positions, totals: list[float], rng: random.Random) -> int:
    best = max(totals)
    ties = [p for p, t in zip(pos, totals) if t >= best - 1e-12]
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def weighted_random(pos: Positions, totals: list[float], rng: random.Random) -> int:
    if sum(totals) <= 0:
        return rng.choice(pos)
    return rng.choices(pos, weights=totals)[0]


PICKERS = {"max_score": max_score, "weighted_random": weighted_random}


def _spec(item: Any) -> tuple[str, dict]:
    if isinstance(item, str):
        return item, {}
    if isinstance(item, dict) and "name" in item:
        params = {k: v for k, v in item.items() if k not in ("name", "weight")}
        return item["name"], params
    raise ValueError(f"bad plugin spec {item!r}: a name or {{'name': ..., ...}}")


def _build(table: dict, kind: str, name: str, params: dict):
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(table)}")
    try:
        return table[name](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for {kind} {name!r}: {exc}") from None


class CompositeRouter(Router):
    name = "composite"

    def __init__(self, filters: Sequence[Any] = ("healthy", "overload"),
                 scorers: Any = None, picker: str = "max_score", seed: int = 0) -> None:
        if scorers is None:
            scorers = {"prefix": 2.0, "queue": 1.0}
        self.filters = [_build(FILTERS, "filter", *_spec(f)) for f in filters]
        items = ([{"name": n, "weight": w} for n, w in scorers.items()]
                 if isinstance(scorers, dict) else list(scorers))
        self.scorers: list[tuple[float, Scorer]] = []
        for it in items:
            name, params = _spec(it)
            weight = float(it.get("weight", 1.0)) if isinstance(it, dict) else 1.0
            self.scorers.append((weight, make_scorer(name, **params)))
        if not self.scorers:
            raise ValueError("a composite router needs at least one scorer")
        if picker not in PICKERS:
            raise ValueError(f"unknown picker {picker!r}; known: {', '.join(PICKERS)}")
        self.picker = PICKERS[picker]
        self.rng = random.Random(seed)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        for f in self.filters:
            kept = f(ctx, replicas, pos)
            if kept:
                pos = kept
        totals = [0.0] * len(pos)
        for w, s in self.scorers:
            for i, v in enumerate(s.score(ctx, replicas, pos)):
                totals[i] += w * v
        return self.picker(pos, totals, self.rng)

    def on_start(self, ctx, replica):
        for _, s in self.scorers:
            s.on_start(ctx, replica)

    def on_kv_event(self, replica, event):
        for _, s in self.scorers:
            s.on_kv_event(replica, event)

    def on_replica_removed(self, replica):
        for _, s in self.scorers:
            s.on_replica_removed(replica)

    def predicted_hit_blocks(self, ctx, replica):
        for _, s in self.scorers:
            got = s.predicted_hit_blocks(ctx, replica)
            if got is not None:
                return got
        return 0


ROUTERS = {"composite": lambda **params: CompositeRouter(**params)}
