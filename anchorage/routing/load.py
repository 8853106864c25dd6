"""Load predicates shared by the routers.

- ``load_score(r, kv_weight, tokens_per_request)`` =
  ``r.running + r.waiting + r.queued_tokens / tokens_per_request + kv_weight * r.kv_usage``:
  the one number every router compares. Request counts say how many sequences a replica
  serves; queued prefill tokens say how much work stands before a new request's first
  token (ten queued 16k-token prompts are not ten queued 200-token ones), counted in
  request equivalents (``tokens_per_request``, default ``TOKENS_PER_REQUEST`` = 2048: one
  queued request per 2,048 prompt tokens still to prefill); KV usage breaks near-ties and
  counts when queues are empty. ``tokens_per_request = 0`` ignores queued tokens (the
  request-count signal alone).
- ``load_scores(replicas, ...)``: the same for every replica, by position.
- ``is_imbalanced(loads, abs_t, rel_t)``: SGLang's cache-aware router predicate:
  ``max - min > abs_t and max > rel_t * min``. When it holds, cache affinity yields to load.
- ``overloaded(load, mean, ratio, abs_t)``: ``load > ratio * mean + abs_t`` (spill rule).
- ``PrefillRate``: a replica's measured prefill rate (tokens per second) from its cumulative
  counters: ``update(computed_tokens, prefill_seconds)`` takes the totals (vLLM:
  ``vllm:prompt_tokens_total - vllm:prompt_tokens_cached_total`` and
  ``vllm:request_prefill_time_seconds_sum``); each interval with prefill time adds
  ``delta tokens / delta seconds`` to an exponential average (weight ``alpha``); a counter
  that went backwards (the engine restarted) restarts the baseline. Requests prefilled in
  the same steps each count the step's time, so the figure is a per-request speed, the
  same bias on every replica: what the ``agent`` router compares between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from anchorage.routing.base import ReplicaView

TOKENS_PER_REQUEST = 2048.0


def load_score(r: ReplicaView, kv_weight: float = 1.0,
               tokens_per_request: float = TOKENS_PER_REQUEST) -> float:
    s = r.running + r.waiting + kv_weight * r.kv_usage
    if tokens_per_request > 0 and r.queued_tokens:
        s += r.queued_tokens / tokens_per_request
    return s


def load_scores(replicas: Sequence[ReplicaView], kv_weight: float = 1.0,
                tokens_per_request: float = TOKENS_PER_REQUEST) -> list[float]:
    """``load_score`` of every replica, by position (one pass, for routers that compare
    every replica on each decision)."""
    if tokens_per_request > 0:
        t = tokens_per_request
        return [r.running + r.waiting + kv_weight * r.kv_usage + r.queued_tokens / t
                for r in replicas]
    return [r.running + r.waiting + kv_weight * r.kv_usage for r in replicas]


def is_imbalanced(loads: Sequence[float], abs_t: float, rel_t: float) -> bool:
    if not loads:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_t and hi > rel_t * lo


def overloaded(load: float, mean: float, ratio: float, abs_t: float) -> bool:
    return load > ratio * mean + abs_t



@dataclass
class PrefillRate:
    alpha: float = 0.3
    rate: float = 0.0                    # tokens per second; 0 until measured
    _tokens: float | None = None
    _seconds: float | None = None

    def update(self, computed_tokens: float, prefill_seconds: float) -> float:
        if (self._tokens is None or computed_tokens < self._tokens
                or prefill_seconds < self._seconds):
            self._tokens, self._seconds = computed_tokens, prefill_seconds
            return self.rate
        dt = prefill_seconds - self._seconds
        dn = computed_tokens - self._tokens
        if dt > 0 and dn > 0:
            x = dn / dt
            self.rate = x if self.rate <= 0 else (1 - self.alpha) * self.rate + self.alpha * x
            self._tokens, self._seconds = computed_tokens, prefill_seconds
        return self.rate
