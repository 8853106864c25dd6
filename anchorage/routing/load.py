"""Load predicates shared by the routers.

- ``load_score(r, kv_weight) = r.running + r.waiting + kv_weight * r.kv_usage``: the
  quantity every router compares (queue first; KV usage breaks near-ties and counts when
  queues are empty).
- ``is_imbalanced(loads, abs_t, rel_t)``: SGLang's cache-aware router predicate:
  ``max - min > abs_t and max > rel_t * min``. When it holds, cache affinity yields to load.
- ``overloaded(load, mean, ratio, abs_t)``: ``load > ratio * mean + abs_t`` (spill rule).
"""

from __future__ import annotations

import random
from typing import Sequence

from anchorage.routing.base import ReplicaView


def load_score(r: ReplicaView, kv_weight: float = 1.0) -> float:
    return r.running + r.waiting + kv_weight * r.kv_usage


def is_imbalanced(loads: Sequence[float], abs_t: float, rel_t: float) -> bool:
    if not loads:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_t and hi > rel_t * lo


def overloaded(load: float, mean: float, ratio: float, abs_t: float) -> bool:
    return load > ratio * mean + abs_t


def least_loaded(replicas: Sequence[ReplicaView], positions: Sequence[int],
                 rng: random.Random | None = None, kv_weight: float = 1.0) -> int:
    """Position of the least loaded replica among ``positions`` (random tie break)."""
    best = min(load_score(replicas[p], kv_weight) for p in positions)
    ties = [p for p in positions if load_score(replicas[p], kv_weight) == best]
    return ties[0] if len(ties) == 1 or rng is None else rng.choice(ties)
