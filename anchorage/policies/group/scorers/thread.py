"""Thread scorer: a session's private blocks with one agent, valued by the session's
expected wait and the chance that it calls that agent again.

Formula
-------
Group ``thread(s, f)``: session ``s``'s blocks past the shared prefix, with agent ``f``
(with transitions on; else one thread per session). With gaps on:

    ``T = W_s(e)``  (``ModelView.session_wait``: expected wait per expected return given
    the elapsed time ``e`` since the session's last request; inf once it ended)

or, when that is no signal (None), recency with ``mult = 1 / max(P(return | e), floor)``
(``ModelView.return_probability``); for a session of one request, when ``q =
ModelView.first_return()`` is below 1, also ``add = d (1 / max(q, floor) - 1)``, ``d``:
the mean time between completions (``done_gap``): a one-request session comes back with
probability ``q`` and not before the next completion, so a fresh block of a flood of
single-use prompts is not "just used" (recency's view of age 0). With transitions on, the gate open, and ``f`` known:
``(p, steps) = ModelView.thread_reach(s, f)`` (another agent: the learned reach from the
session's current agent; its own: the stay probability), ``p`` floored at ``floor``
(0.02), ``x = (steps - 1) g`` (``g``: the mean step gap):

    ``T = (T + x) / p``   or, for recency,   ``mult /= p, add = x / p``.

Low survival (``survival_threshold`` > 0): ``T = inf`` when ``p * P(e < tau <= e +
horizon_s | tau > e)`` (``ModelView.thread_survival``) is below the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anchorage.policies.group import params as P

if TYPE_CHECKING:
    from anchorage.policies.group.groups import Group
    from anchorage.policies.group.view import ModelView

INF = math.inf


@dataclass(frozen=True)
class ThreadParams:
    gaps: bool = True             # signal ``gaps``
    transitions: bool = True      # signal ``transitions``
    floor: float = 0.02           # floor of the return and reach probabilities
    survival_threshold: float = 0.0
    horizon_s: float = INF

    def __post_init__(self) -> None:
        P.flag("gaps", self.gaps)
        P.flag("transitions", self.transitions)
        P.number("floor", self.floor, 0.0, 1.0, lo_open=True)
        P.number("survival_threshold", self.survival_threshold, 0.0, 1.0)
        P.number("horizon_s", self.horizon_s, 0.0, lo_open=True)


class Scorer:
    def __init__(self, p: ThreadParams, view: "ModelView"):
        self.p = p
        self.view = view

    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        p, v = self.p, self.view
        sess = g.sess
        T = None
        mult, add = 1.0, 0.0
        p_use = 1.0  # P(the session calls the thread's agent at all)
        if p.gaps:
            T = v.session_wait(sess, now)
            if T is None:
                mult = 1.0 / max(v.return_probability(sess, now), p.floor)
                if sess.n == 1:
                    q = v.first_return()
                    if q < 1.0:
                        add = v.done_gap * (1.0 / max(q, p.floor) - 1.0)
        if p.transitions and v.transitions_open() and g.agent is not None and T != INF:
            pr, steps = v.thread_reach(sess, g.agent.fp)
            if pr is not None:
                pr = max(pr, p.floor)
                p_use = pr
                extra = (steps - 1) * v.step_gap
                if T is None:
                    mult, add = mult / pr, (add + extra) / pr
                else:
                    T = (T + extra) / pr
        thr = p.survival_threshold
        if thr > 0 and T != INF:
            if v.thread_survival(sess, now, p.horizon_s) * p_use < thr:
                T = INF  # low survival
        return T, mult, add
