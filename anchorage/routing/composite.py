"""``composite``: routers composed from configuration, llm-d style (filter, scorers, picker).

Spec: for each request, (1) apply the filters in order to the replica positions; if a
filter would leave none, it is skipped (a saturated fleet still routes; admission control
is the caller's job). (2) Each scorer returns a score in [0, 1] per remaining replica;
``total_r = sum_s weight_s * score_s(r)``. (3) The picker chooses: ``max_score`` (highest
total, ties broken at random) or ``weighted_random`` (probability proportional to total).

Filters: ``healthy``; ``overload`` (``max_load`` 64 running+waiting, ``max_kv_usage`` 0.95).
Scorers:
- ``queue``: ``1 - (load_r - min) / (max - min)`` (1 for all when equal).
- ``waiting_queue``: the same over ``waiting_r`` alone (the Gateway API inference
  extension's ``queue-scorer``, on vLLM's waiting-queue size).
- ``kv_usage``: ``1 - kv_usage_r``.
- ``prefix``: ``m_r / len(keys)`` over the router's prefix model (``capacity_blocks``).
- ``precise_prefix``: the same over the replicas' KV events.
- ``session``: 1 for the replica that served the request's session last, else 0
  (``max_sessions`` 200_000, ``max_table_bytes`` 64 MiB: an LRU bounded in both).
- ``anchor``: 1 if the replica reports the request's agent in ``extra["anchors"]``.

Configuration: ``filters`` (list of names or ``{"name": ..., **params}``; default
``["healthy", "overload"]``), ``scorers`` (``{name: weight}`` or a list of
``{"name", "weight", **params}``; default ``{"prefix": 2, "queue": 1}``), ``picker``
(``"max_score"``), ``seed`` (0).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.agent import agent_label
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.keys import agent_id
from anchorage.routing.load import load_score
from anchorage.routing.prefix_index import PrefixIndex

Positions = list[int]


# -- filters ------------------------------------------------------------------------------
def healthy_filter() -> Callable:
    return lambda ctx, reps, pos: [p for p in pos if reps[p].healthy]


def overload_filter(max_load: int = 64, max_kv_usage: float = 0.95) -> Callable:
    return lambda ctx, reps, pos: [p for p in pos
                                   if reps[p].load < max_load and reps[p].kv_usage < max_kv_usage]


FILTERS: dict[str, Callable[..., Callable]] = {"healthy": healthy_filter,
                                               "overload": overload_filter}


# -- scorers ------------------------------------------------------------------------------
class Scorer:
    def score(self, ctx: RequestContext, reps: Sequence[ReplicaView], pos: Positions) -> list[float]:
        raise NotImplementedError

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_kv_event(self, replica: int, event: Any) -> None:
        pass

    def on_replica_removed(self, replica: int) -> None:
        pass


class QueueScorer(Scorer):
    def score(self, ctx, reps, pos):
        loads = [load_score(reps[p]) for p in pos]
        lo, hi = min(loads), max(loads)
        return [1.0] * len(pos) if hi == lo else [1 - (x - lo) / (hi - lo) for x in loads]


class WaitingQueueScorer(Scorer):
    def score(self, ctx, reps, pos):
        q = [reps[p].waiting for p in pos]
        lo, hi = min(q), max(q)
        return [1.0] * len(pos) if hi == lo else [(hi - x) / (hi - lo) for x in q]


class KVUsageScorer(Scorer):
    def score(self, ctx, reps, pos):
        return [1.0 - min(1.0, max(0.0, reps[p].kv_usage)) for p in pos]


class PrefixScorer(Scorer):
    def __init__(self, capacity_blocks: int = 100_000, from_events: bool = False) -> None:
        self.from_events = from_events
        self.index = PrefixIndex(None if from_events else capacity_blocks)
        self._capacity = capacity_blocks

    def score(self, ctx, reps, pos):
        keys = ctx.keys
        if not keys:
            return [0.0] * len(pos)
        if not self.from_events:
            for p in pos:
                self.index.set_capacity(reps[p].index, reps[p].capacity_blocks or self._capacity)
        m = self.index.match(keys)
        return [m.get(reps[p].index, 0) / len(keys) for p in pos]

    def on_start(self, ctx, replica):
        if not self.from_events:
            self.index.insert(replica, ctx.keys)

    def on_kv_event(self, replica, event):
        if self.from_events:
            self.index.apply_event(replica, event)

    def on_replica_removed(self, replica):
        self.index.clear(replica)


class SessionScorer(Scorer):
    def __init__(self, max_sessions: int = 200_000, max_table_bytes: int = 64 << 20) -> None:
        self.max_sessions = max_sessions
        self.last = BoundedLRU(max_sessions, max_table_bytes)

    def score(self, ctx, reps, pos):
        r = self.last.get((ctx.tenant, ctx.session_id)) if ctx.session_id is not None else None
        return [1.0 if reps[p].index == r else 0.0 for p in pos]

    def on_start(self, ctx, replica):
        if ctx.session_id is not None:
            self.last[(ctx.tenant, ctx.session_id)] = replica


class AnchorScorer(Scorer):
    def __init__(self, anchor_blocks: int = 4) -> None:
        self.anchor_blocks = anchor_blocks

    def score(self, ctx, reps, pos):
        label = agent_label(agent_id(ctx, self.anchor_blocks))
        return [1.0 if label in reps[p].extra.get("anchors", ()) else 0.0 for p in pos]


SCORERS: dict[str, Callable[..., Scorer]] = {
    "queue": QueueScorer, "waiting_queue": WaitingQueueScorer, "kv_usage": KVUsageScorer,
    "prefix": PrefixScorer,
    "precise_prefix": lambda **kw: PrefixScorer(from_events=True, **kw),
    "session": SessionScorer, "anchor": AnchorScorer,
}


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
            self.scorers.append((weight, _build(SCORERS, "scorer", name, params)))
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
            if isinstance(s, PrefixScorer):
                return s.index.match_len(replica, ctx.keys)
        return 0


ROUTERS = {"composite": lambda **params: CompositeRouter(**params)}
