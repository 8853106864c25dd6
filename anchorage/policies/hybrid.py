"""`hybrid` (the default policy): agent semantics and tool timing in one expected-time score.

Specification
-------------
A preset of group-scored eviction (``anchorage.policies.group``, whose modules state the
formulas) with every signal on: anchors valued by agent arrival rate and by the
per-session transition model (CacheScout; ``group/scorers/anchor.py``), session threads
valued by the expected time to the session's next request conditioned on the elapsed time
and the pending tool (CacheWise; ``group/scorers/thread.py``), generated-token blocks
evicted first once learned never reused (``output.py``), skipped blocks by their learned
reuse (``stale.py``, ``dup.py``). Each group's score is one quantity, the expected time
until its next use; a group with no informative signal is ordered by recency, so with no
signal at all ``hybrid`` is exactly ``lru``.

Parameters (all optional; typed sections in ``group/config.py``): the model's
(``min_samples`` 16, ``end_factor`` 2.0, ``eps`` 0.1, ``max_sessions`` 4096,
``max_agents`` 64, ``max_tools`` 64, ``max_prefix_keys`` 2**18, ``global_gaps`` "auto",
``no_tool_context`` False, ``turnover_gap_ratio`` 2.0, ``wait_min_gaps`` 64,
``reach_steps`` 2), the output and stale scorers' (``dead_min_samples`` 64,
``dead_max_reuse`` 0.02), the operator's tuning (``survival_threshold``, ``horizon_s``,
``recency_scale_s``, ``r_min``, ``prefetch``, ``prefetch_rate_per_s``), ``signals``
(default all on), and ``clusters``: an argument clusterer
(``anchorage.policies.tool_clusters``) or None for tool names only.
``make_policy("hybrid", block_size=16, horizon_s=120, ...)``; an unknown parameter is a
TypeError naming it, a value out of range a ValueError.
"""

from __future__ import annotations

from typing import Any

from anchorage.policies.base import UnknownParameterError
from anchorage.policies.group import GroupEvictionPolicy, Signals, build_config

SIGNALS = Signals()


def hybrid(block_size: int = 16, clusters: Any = None, **params: Any) -> GroupEvictionPolicy:
    if "cluster_fn" in params:
        raise UnknownParameterError("cluster_fn")
    cfg = build_config("hybrid", params.pop("signals", SIGNALS), block_size=block_size,
                       cluster_fn=clusters.cluster if clusters is not None else None,
                       **params)
    return GroupEvictionPolicy(cfg)


POLICIES = {"hybrid": hybrid}
