"""Fleet signals: the windowed metrics one autoscaling decision reads.

Built by the operator's Prometheus client from these series (rates and averages over the
window ``w``, summed over the target's replicas):

- ``hit_rate``: rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)
  (also the ``ray_vllm:``/``ray_vllm_`` names Ray Serve LLM exports); tokens, 0..1.
  ``None`` when nothing was queried in the window (no traffic: no evidence either way).
- ``queue_depth``: mean vllm:num_requests_waiting per replica.
- ``kv_usage``: mean vllm:kv_cache_usage_perc (0..1) over replicas.
- ``capacity_miss_rate``: rate(anchorage_evictions_reused_total) * block_size /
  rate(queries): the fraction of queried tokens that missed because their block had been
  evicted shortly before (the node agent's ghost list). This is the part of the hit-rate
  shortfall that more KV capacity (more replicas) recovers. 0 when the series is absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class MetricsError(ValueError):
    """Metrics are missing or nonsensical; the caller holds its last decision."""


@dataclass(frozen=True)
class FleetSignals:
    hit_rate: float | None
    queue_depth: float
    kv_usage: float
    capacity_miss_rate: float = 0.0

    @classmethod
    def from_rates(cls, *, hits_per_s: float | None, queries_per_s: float | None,
                   waiting_total: float | None, replicas: int, kv_usage: float | None,
                   reused_soon_evictions_per_s: float | None = None,
                   block_size: int = 16) -> "FleetSignals":
        """Combine raw windowed values; raise MetricsError on missing or impossible ones."""
        for name, v in (("hits rate", hits_per_s), ("queries rate", queries_per_s),
                        ("waiting requests", waiting_total), ("KV usage", kv_usage),
                        ("reused-soon evictions rate", reused_soon_evictions_per_s)):
            if v is not None and (not isinstance(v, (int, float)) or math.isnan(v)
                                  or math.isinf(v) or v < 0):
                raise MetricsError(f"{name} is {v!r}; expected a finite number >= 0")
        if waiting_total is None:
            raise MetricsError("no vllm:num_requests_waiting series for the target")
        if kv_usage is None:
            raise MetricsError("no vllm:kv_cache_usage_perc series for the target")
        if kv_usage > 1.0 + 1e-9:
            raise MetricsError(f"KV usage {kv_usage:.3g} is above 1 (expected a fraction)")
        if queries_per_s is None or queries_per_s <= 0:
            hit_rate = None
            miss = 0.0
        else:
            hits = hits_per_s or 0.0
            if hits > queries_per_s * (1 + 1e-6):
                raise MetricsError(f"prefix-cache hits ({hits:.3g}/s) exceed queries "
                                   f"({queries_per_s:.3g}/s)")
            hit_rate = min(1.0, hits / queries_per_s)
            miss = min(1.0 - hit_rate,
                       (reused_soon_evictions_per_s or 0.0) * block_size / queries_per_s)
        per_replica = waiting_total / max(1, replicas)
        return cls(hit_rate=hit_rate, queue_depth=per_replica, kv_usage=min(1.0, kv_usage),
                   capacity_miss_rate=miss)
