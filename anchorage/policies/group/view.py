"""The read-only view of the workload model: what scorers and observers may ask it.

Specification
-------------
``ModelView(model)`` answers, from the model's learned state (``model`` spec), without
changing what is learned (only memoised results are cached):

- ``session_wait(s, now)``: the expected wait until session ``s``'s next request, or None
  (no better than recency). Ended: inf; no request yet: None. ``e = now - last_s``. With
  ``tools`` on and a histogram for the pending tool (and argument cluster) with at least
  ``min_samples`` gaps: ``W(e) = E[tau - e | tau > e] / P(return | tau > e)``
  (``GapHistogram.expected_wait``). Otherwise by the gap mode (``global_gaps``):
  ``"wait"``: for a session after its first request (signal ``first``, once
  ``min_samples`` first gaps and ends and two gaps are learned) ``W(e)`` from the
  first-request histogram, else from all gaps when that histogram is informative (at
  least two bins); ``"survival"`` and ``"off"``: None. ``"auto"`` (default):
  ``"survival"`` until ``wait_min_gaps`` (64) gaps are learned, then ``"wait"`` when at
  least 10 % of learned gaps followed a tool call or the cache turns over faster than
  ``turnover_gap_ratio`` (2) median session gaps, else ``"survival"``.
- ``return_probability(s, now)``: ``P(return | e)`` from all gaps and ends in
  ``"survival"`` mode once ``min_samples`` gaps are learned; else 1. For a session of one
  request, at most ``first_return()``.
- ``first_return()``: the share of one-request sessions that came back before all their
  blocks left the cache, ``q = (hits + 1) / (hits + n + 2)`` over ``firsts`` (a session
  that returns after its blocks went counts in both), when ``q < 0.5`` (most of them do
  not come back; with no evidence ``q = 0.5``); else 1 (the order stays recency's).
  Without session ids every prompt that continues no conversation is such a session,
  and a flood of single-use prompts drives ``q`` to 0.
- ``thread_survival(s, now, h)``: ``P(e < tau <= e + h | tau > e)`` from the histogram
  ``s`` is scored by (its tool's, else all gaps; 1 until ``min_samples`` gaps); 0 ended.
- ``thread_reach(s, f)``: ``(p, steps)``, the probability that ``s`` calls agent ``f``
  within ``k`` steps (before it ends) and the expected steps given that, or ``(None, 1)``
  unknown. Another agent than the session's current ``c``: ``reach_k(c, f)``
  (``TransitionLearner.reach_fast`` for ``k = 2``, ``hit_fast`` over ``k`` steps
  otherwise). ``c``'s own thread, once tools were seen and at least 8 stay observations:
  ``p = p_stay + (1 - p_stay) p2``, ``steps = (p_stay + s2 (1 - p_stay) p2) / p`` with
  ``p_stay = (C_stay + eps) / (n + 2 eps)`` given (agent, tool pending?), ``p2 =
  reach_k(c, c) - P(c | c)`` and ``s2`` its expected steps (2 when ``k = 2``).
- ``reach_k()``: ``reach_steps``, or with ``"turnover"`` the steps that fit in one cache
  turnover, ``turnover / g`` rounded down to a power of two, at most 32, once that is at
  least 4 (else 2).
- ``call_rate(f) = sum_i N_i P(f | i)``; ``transitions_open()``: ``R >= r_min``;
  ``step_gap`` (``g``), ``done_gap`` (time between completions), ``outputs`` and
  ``stale`` (reuse counts).
"""

from __future__ import annotations

import math
from typing import Hashable

from anchorage.policies.group.model import ReuseCount, Session, WorkloadModel

INF = math.inf


class ModelView:
    """Read-only queries over a ``WorkloadModel`` (module spec)."""

    def __init__(self, model: WorkloadModel):
        self.model = model
        self._sig = model.sig
        self._gaps = model.gaps
        self._trans = model.trans
        p = model.params
        self._global_gaps = p.global_gaps
        self._reach_steps = p.reach_steps
        self._wait_min_gaps = p.wait_min_gaps
        self._turnover_gap_ratio = p.turnover_gap_ratio

    # -- plain readings -------------------------------------------------------------------

    @property
    def step_gap(self) -> float:
        return self.model.step_gap

    @property
    def done_gap(self) -> float:
        return self.model.done_gap

    @property
    def outputs(self) -> ReuseCount:
        return self.model.outputs

    @property
    def stale(self) -> ReuseCount:
        return self.model.stale

    def transitions_open(self) -> bool:
        m = self.model
        return m.R >= m.r_min

    def call_rate(self, fp: Hashable) -> float:
        """``sum_i N_i P(fp | i)`` over the sessions' current agents."""
        rate = 0.0
        prob = self._trans.prob
        for i, n_i in self.model.at_agent.items():
            rate += n_i * prob(i, fp)
        return rate

    # -- gaps -----------------------------------------------------------------------------

    def session_wait(self, sess: Session, now: float) -> float | None:
        if sess.ended:
            return INF
        if sess.n == 0:
            return None
        gaps = self._gaps
        h = gaps.specific(sess.tool, sess.cluster) if self._sig.tools else None
        e = max(0.0, now - sess.last_s)
        if h is not None:
            return h.expected_wait_fast(e)
        if self.gap_mode() == "wait":
            if sess.n == 1 and self._first_ready():
                return self.model.first.expected_wait_fast(e)
            g = gaps.histogram()
            if g is not None and g.informative():
                return g.expected_wait_fast(e)
        return None

    def gap_mode(self) -> str:
        mode = self._global_gaps
        if mode == "auto":
            gaps = self._gaps
            if gaps.global_hist.n < self._wait_min_gaps:
                return "survival"  # too few gaps for absolute waits to beat recency
            if gaps.tool_fraction >= 0.1:
                return "wait"
            med = self.model.gap_median
            if (med is not None
                    and self.model.turnover.turnover_s < self._turnover_gap_ratio * med):
                return "wait"  # a small cache: sessions cannot stay across a gap anyway
            return "survival"
        return mode

    def _first_ready(self) -> bool:
        f = self.model.first
        return self._sig.first and f.n + f.ends >= self._gaps.min_samples and f.n >= 2

    def return_probability(self, sess: Session, now: float) -> float:
        if sess.n == 0:
            return 1.0
        h = self._gaps.global_hist
        p = (1.0 if self.gap_mode() != "survival" or h.n < self._gaps.min_samples
             else h.p_return(max(0.0, now - sess.last_s)))
        if sess.n == 1:
            p = min(p, self.first_return())
        return p

    def first_return(self) -> float:
        f = self.model.firsts
        q = (f.hits + 1) / (f.hits + f.n + 2)
        return q if q < 0.5 else 1.0

    def thread_survival(self, sess: Session, now: float, horizon_s: float) -> float:
        if sess.ended:
            return 0.0
        gaps = self._gaps
        h = gaps.specific(sess.tool, sess.cluster) if self._sig.tools else None
        if h is None:
            h = gaps.global_hist
            if h.n < gaps.min_samples:
                return 1.0
        return h.p_within(max(0.0, now - sess.last_s), horizon_s)

    # -- transitions ----------------------------------------------------------------------

    def thread_reach(self, sess: Session, fp: Hashable) -> tuple[float | None, float]:
        cur = sess.agent
        if cur is None:
            return None, 1.0
        if cur != fp:
            return self.reach(cur, fp)
        return self._stay(sess)

    def reach_k(self) -> int:
        k = self._reach_steps
        if k != "turnover":
            return k
        g, tv = self.model.step_gap, self.model.turnover.turnover_s
        if g <= 0 or tv == INF or tv < 4 * g:
            return 2
        return min(32, 1 << (int(tv / g).bit_length() - 1))

    def reach(self, i: Hashable, j: Hashable) -> tuple[float, float]:
        """(P(a session at agent ``i`` calls ``j`` within ``reach_k()`` steps), expected
        steps given that)."""
        k = self.reach_k()
        if k <= 2:
            return self._trans.reach_fast(i, j)
        return self._trans.hit_fast(i, j, k)

    def _stay(self, sess: Session) -> tuple[float | None, float]:
        st = self.model.stay
        tot = st.row_total(sess.state)
        if tot < 8 or not self._gaps.tools_seen:  # without tools: off (docs/research)
            return None, 1.0
        p1 = (st.count(sess.state, True) + st.eps) / (tot + 2 * st.eps)
        p_all, s_all = self.reach(sess.agent, sess.agent)
        p_one = self._trans.prob(sess.agent, sess.agent)
        p2 = max(0.0, p_all - p_one)  # back after leaving (2 or more steps)
        s2 = 2.0
        if p2 > 0 and self.reach_k() > 2:
            s2 = max(2.0, (p_all * s_all - p_one) / p2)
        p = p1 + (1.0 - p1) * p2
        steps = (p1 + s2 * (1.0 - p1) * p2) / p if p > 0 else 2.0
        return p, steps

    # -- offline references ---------------------------------------------------------------

    def known_next_use(self, g, now: float) -> float | None:
        """A group's true next-use time (absolute), or None: unknown. Online policies know
        nothing; the offline references (``hybrid-oracle``) override it."""
        return None
