"""`cachewise`: evict the session whose next request is expected furthest away, predicted
from the last request's tool metadata (CacheWise section 5.2), learned online.

Specification
-------------
A preset of group-scored eviction (``anchorage.policies.group``) with the tool-timing
signals only: each session thread's score (``group/scorers/thread.py``) is the expected
wait

    ``W_s(e) = E[tau - e | tau > e] / P(return | tau > e)``,  ``e = now - last request``

from the gap histogram of the session's pending ``tool_name``, refined by the cluster of
its ``tool_args`` (``anchorage.policies.tool_clusters``: TF-IDF + k-means when warm-started
with ``warm_start=[(tool_name, tool_args), ...]`` or ``warm_start_trace=<path>``, else the
argument signature), falling back to per tool, then to all gaps, then to recency (fewer than
``min_samples`` = 16 gaps). Gaps are learned when the session's next request arrives; a
session with no pending tool is scored from the "no tool" histogram (user think time,
usually the longest: idle sessions go first); sessions idle past ``end_factor`` x p99 gap
are ended. Generated-token blocks go first once learned never reused. Periodic re-scoring
as in the paper (section 5.3). Anchors and agent transitions are not used (that is
``cachescout``; ``hybrid`` has both).

``cachewise-oracle`` (offline, simulator only, a reference like the paper's CacheWise*):
the same policy, but a session's wait (``ModelView.session_wait``, replaced by
``TrueWaitView``) is the true time until its next request, read from
the replay (``T = t_next - now``, inf if the session never returns). ``t_next`` is on the
trace's clock, which is the policy clock only in sequential replay. In the timed
simulator's closed loop a session's next request arrives a known gap after its previous
one completes, on the simulator's clock: given ``next_gap_s`` (per ``seq``: that gap in
seconds, inf when the session ends), ``T = last_done + next_gap_s[last] - now`` (exact
arrival; admission may come later).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from anchorage.policies.base import RequestContext, UnknownParameterError, next_in_session
from anchorage.policies.group import GroupEvictionPolicy, Signals, build_config
from anchorage.policies.group.model import Session, WorkloadModel
from anchorage.policies.group.view import ModelView
from anchorage.policies.tool_clusters import ArgClusterer

SIGNALS = Signals(anchors=False, transitions=False, gaps=True, tools=True, dead_outputs=True)


def _clusters(clusters: ArgClusterer | None, warm_start: Sequence[tuple[Any, Any]] | None,
              warm_start_trace: str | None) -> ArgClusterer:
    if clusters is None:
        clusters = ArgClusterer()
    if warm_start_trace is not None:
        from anchorage.trace.format import read_trace
        _, recs = read_trace(warm_start_trace)
        warm_start = [(r.tool_name, r.tool_args) for r in recs if r.tool_name]
    if warm_start:
        clusters.fit(warm_start)
    return clusters


def cachewise(block_size: int = 16, clusters: ArgClusterer | None = None,
              warm_start: Sequence[tuple[Any, Any]] | None = None,
              warm_start_trace: str | None = None, **params: Any) -> GroupEvictionPolicy:
    return _build("cachewise", ModelView, block_size, clusters, warm_start,
                  warm_start_trace, **params)


def _build(name: str, view: Callable[[WorkloadModel], ModelView], block_size: int,
           clusters: ArgClusterer | None, warm_start: Sequence[tuple[Any, Any]] | None,
           warm_start_trace: str | None, **params: Any) -> GroupEvictionPolicy:
    if "cluster_fn" in params:
        raise UnknownParameterError("cluster_fn")
    cl = _clusters(clusters, warm_start, warm_start_trace)
    cfg = build_config(name, params.pop("signals", SIGNALS), block_size=block_size,
                       cluster_fn=cl.cluster, **params)
    return GroupEvictionPolicy(cfg, view=view)


class TrueWaitView(ModelView):
    """``session_wait`` read from the future (module spec): a reference only."""

    def __init__(self, model: WorkloadModel, next_s: Sequence[float],
                 gap_s: Sequence[float] | None):
        super().__init__(model)
        self._next_s = next_s
        self._gap_s = gap_s

    def session_wait(self, sess: Session, now: float) -> float | None:
        if sess.last_seq < 0 or sess.last_seq >= len(self._next_s):
            return None
        if self._gap_s is not None:  # closed loop: completion + the known gap
            return max(0.0, sess.last_s + self._gap_s[sess.last_seq] - now)
        return max(0.0, self._next_s[sess.last_seq] - now)


def cachewise_oracle(contexts: Sequence[RequestContext], block_size: int = 16,
                     next_gap_s: Sequence[float] | None = None,
                     clusters: ArgClusterer | None = None,
                     warm_start: Sequence[tuple[Any, Any]] | None = None,
                     warm_start_trace: str | None = None,
                     **params: Any) -> GroupEvictionPolicy:
    if next_gap_s is not None and len(next_gap_s) != len(contexts):
        raise ValueError(f"next_gap_s has {len(next_gap_s)} entries for "
                         f"{len(contexts)} requests")
    gap_s = None if next_gap_s is None else [float(g) for g in next_gap_s]
    next_s = [math.inf if c is None else c.now_s for c in next_in_session(contexts)]
    pol = _build("cachewise-oracle", lambda m: TrueWaitView(m, next_s, gap_s), block_size,
                 clusters, warm_start, warm_start_trace, **params)
    pol.offline = True
    return pol


POLICIES = {"cachewise": cachewise}
OFFLINE_POLICIES = {"cachewise-oracle": cachewise_oracle}
