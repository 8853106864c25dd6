"""``prefix``: approximate prefix-cache-aware routing with SGLang's balance thresholds.

Spec (after SGLang's cache-aware router, ``sgl-model-gateway/src/policies/cache_aware.rs``),
over the healthy replicas, with ``load = load_score(r)`` (``anchorage.routing.load``:
running + waiting requests + queued prefill tokens in request equivalents + KV usage;
``tokens_per_request = 0`` gives SGLang's request counts alone):

1. Balance check: if ``max(load) - min(load) > balance_abs_threshold`` and
   ``max(load) > balance_rel_threshold * min(load)``, the fleet is imbalanced: route to
   the least loaded replica (``kv_usage`` breaks ties).
2. Otherwise, ``m_r`` = leading blocks of the request believed cached on ``r`` (a
   ``PrefixIndex``); ``match_rate = max_r m_r / len(keys)``. If
   ``match_rate > cache_threshold``: route to the replica with the largest ``m_r`` (ties:
   least loaded).
3. Otherwise route to the replica with the most free room in the index
   (``capacity - indexed blocks``; ties: least loaded), as SGLang picks the smallest tree.

The index is the router's model, not the replica's truth: on ``on_start`` the request's
keys are inserted for the chosen replica, each replica's entry holds at most its
``capacity_blocks`` (``ReplicaView.capacity_blocks``, else ``capacity_blocks``) keys in
LRU order. ``precise_prefix`` replaces the model with the replicas' own KV events.

Parameters (SGLang's defaults): ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
``balance_rel_threshold`` 1.5; ``capacity_blocks`` (default when the view has none,
100_000); ``tokens_per_request`` (2048); ``capacity_from_view`` (True: the model holds at
most the replica's own KV budget; False: ``capacity_blocks`` whatever the replica holds,
as SGLang's tree is bounded by ``max_tree_size`` and not by the worker's memory).
"""

from __future__ import annotations

from itertools import repeat
from typing import Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.load import TOKENS_PER_REQUEST, is_imbalanced, load_score
from anchorage.routing.prefix_index import PrefixIndex


def cache_aware_pick(keys: Sequence, replicas: Sequence[ReplicaView], pos: Sequence[int],
                     score: dict[int, float], index: PrefixIndex, default_capacity: int,
                     cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                     balance_rel_threshold: float = 1.5, matches: dict | None = None) -> int:
    """Steps 1-3 of the spec over ``index`` with loads ``score`` (by position): the one
    home of SGLang's rule, also the reference the ``agent`` router's guard compares to.
    ``matches``: ``index.match(keys)`` when the caller has it already."""
    by_load = score.__getitem__
    if is_imbalanced(list(score.values()), balance_abs_threshold, balance_rel_threshold):
        return min(pos, key=by_load)
    if matches is None:
        matches = index.match(keys)
    if matches:
        # over the replicas offered (the index may know others: ejected, excluded)
        best = max(map(matches.get, (replicas[p].index for p in pos), repeat(0)))
        if keys and best / len(keys) > cache_threshold:
            return min((p for p in pos if matches.get(replicas[p].index, 0) == best),
                       key=by_load)

    def room(p: int) -> tuple:
        r = replicas[p]
        cap = r.capacity_blocks or default_capacity
        return (-(cap - index.size(r.index)), score[p])
    return min(pos, key=room)


class PrefixRouter(Router):
    name = "prefix"
    #: the index follows the router's own decisions (False: only KV events feed it)
    model_inserts = True

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                 balance_rel_threshold: float = 1.5, capacity_blocks: int = 100_000,
                 tokens_per_request: float = TOKENS_PER_REQUEST,
                 capacity_from_view: bool = True) -> None:
        if tokens_per_request < 0:
            raise ValueError("tokens_per_request must be >= 0")
        self.tokens_per_request = tokens_per_request
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.index = PrefixIndex(capacity_blocks if self.model_inserts else None)
        self._capacity = capacity_blocks
        self.capacity_from_view = capacity_from_view

    def _sync_capacity(self, replicas: Sequence[ReplicaView]) -> None:
        if self.model_inserts:
            for r in replicas:
                cap = (r.capacity_blocks or self._capacity) if self.capacity_from_view \
                    else self._capacity
                self.index.set_capacity(r.index, cap)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        self._sync_capacity(replicas)
        score = {p: load_score(replicas[p], 1.0, self.tokens_per_request) for p in pos}
        return cache_aware_pick(ctx.keys, replicas, pos, score, self.index, self._capacity,
                                self.cache_threshold, self.balance_abs_threshold,
                                self.balance_rel_threshold)

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        if self.model_inserts:
            self.index.insert(replica, ctx.keys)

    def on_replica_removed(self, replica: int) -> None:
        self.index.clear(replica)

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        return self.index.match_len(replica, ctx.keys)


ROUTERS = {"prefix": lambda **params: PrefixRouter(**params)}
