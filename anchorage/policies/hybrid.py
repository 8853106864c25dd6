"""`hybrid` (the default policy): agent semantics and tool timing in one expected-time score.

Specification
-------------
``GroupEvictionPolicy`` (``anchorage.policies.group_eviction``, which states the formulas)
with every signal on: anchors valued by agent arrival rate and by the per-session
transition model (CacheScout), session threads valued by the expected time to the
session's next request conditioned on the elapsed time and the pending tool (CacheWise),
generated-token blocks evicted first once learned never reused. Each group's score is one
quantity, the expected time until its next use; a group with no informative signal is
ordered by recency, so with no signal at all ``hybrid`` is exactly ``lru``.

Parameters (all optional, defaults in ``GroupEvictionPolicy``): ``min_samples`` (16),
``dead_min_samples`` (64), ``dead_max_reuse`` (0.02), ``end_factor`` (2.0), ``eps`` (0.1),
``max_sessions`` (4096), ``max_agents`` (64), ``max_tools`` (64), and ``clusters``: an
argument clusterer (``anchorage.policies.tool_clusters``) or None for tool names only.

Tuning parameters (what the operator tunes; meanings, ranges and formulas in the
``group_eviction`` spec, "Tuning parameters"): ``survival_threshold`` ([0, 1], default 0:
off), ``horizon_s`` (seconds > 0, default inf), ``recency_scale_s`` (seconds > 0, default
None = inf: plain recency), ``r_min`` ([0, 1], default 0), ``prefetch`` (bool, default
True), ``prefetch_rate_per_s`` (>= 0, default 4). ``make_policy("hybrid", block_size=16,
horizon_s=120, ...)``; an unknown parameter is a TypeError, a value out of range a
ValueError.
"""

from __future__ import annotations

from anchorage.policies.group_eviction import GroupEvictionPolicy, Signals


class HybridPolicy(GroupEvictionPolicy):
    name = "hybrid"

    def __init__(self, block_size: int = 16, clusters=None, **params):
        super().__init__(block_size=block_size, signals=Signals(),
                         cluster_fn=clusters.cluster if clusters is not None else None,
                         **params)


def _factory(block_size: int = 16, **params) -> HybridPolicy:
    return HybridPolicy(block_size=block_size, **params)


POLICIES = {"hybrid": _factory}
