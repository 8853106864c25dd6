"""``least_loaded``: power of two choices on queue and KV usage.

Spec (Mitzenmacher, "The power of two choices in randomized load balancing", 2001):
sample ``d`` distinct healthy replicas uniformly at random, send the request to the one
with the lowest ``load_score = running + waiting + queued_tokens / tokens_per_request +
kv_weight * kv_usage`` (``anchorage.routing.load``; ties: the first sampled). With ``d = 2`` the maximum load is exponentially better than random
placement while every decision costs O(d), and it avoids herding onto one stale "best"
replica when several routers decide from the same view.

Parameters: ``choices`` (d, default 2; ``choices >= n`` is plain least-loaded),
``kv_weight`` (1.0), ``tokens_per_request`` (2048; 0: request counts only), ``seed`` (0).
"""

from __future__ import annotations

import random
from typing import Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.load import TOKENS_PER_REQUEST, load_score


class LeastLoadedRouter(Router):
    name = "least_loaded"

    def __init__(self, choices: int = 2, kv_weight: float = 1.0,
                 tokens_per_request: float = TOKENS_PER_REQUEST, seed: int = 0) -> None:
        if choices < 1:
            raise ValueError("choices must be >= 1")
        if tokens_per_request < 0:
            raise ValueError("tokens_per_request must be >= 0")
        self.choices = choices
        self.kv_weight = kv_weight
        self.tokens_per_request = tokens_per_request
        self.rng = random.Random(seed)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        sample = pos if self.choices >= len(pos) else self.rng.sample(pos, self.choices)
        return min(sample, key=lambda p: load_score(replicas[p], self.kv_weight,
                                                    self.tokens_per_request))


ROUTERS = {"least_loaded": lambda **params: LeastLoadedRouter(**params)}
