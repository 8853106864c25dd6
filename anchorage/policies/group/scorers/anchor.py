"""Anchor scorer: shared prefixes, valued by how soon any session calls their agent.

Formula
-------
Group ``anchor(f)``: the leading blocks shared across sessions, keyed by agent
fingerprint ``f`` (``anchorage.fingerprint``). With anchors on (``enabled``) and at least
``min_arrivals`` (3) arrivals of the agent:

    ``T = min(T_base, T_trans)``,  ``T_base = min(ia_f, now - last_f)``

``ia_f``: EWMA (weight 0.05) of the agent's inter-arrival time (an anchor many sessions
reuse is worth more than a single-use block; one idle for long loses protection like any
LRU entry). With transitions on and the predictability gate open (``R >= r_min``):
``T_trans = g / sum_i N_i P(f | i)`` (``N_i``: active sessions whose current agent is
``i``; ``g``: the mean session step gap), when that rate is positive. Low survival (with
``survival_threshold`` > 0): ``T = inf`` when ``1 - exp(-horizon_s / T)`` (Poisson reuse
at rate ``1 / T``) is below the threshold. Otherwise (anchors off, or too few arrivals):
recency.
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
class AnchorParams:
    enabled: bool = True          # signal ``anchors``
    transitions: bool = True      # signal ``transitions``
    min_arrivals: int = 3
    survival_threshold: float = 0.0
    horizon_s: float = INF

    def __post_init__(self) -> None:
        P.flag("anchors", self.enabled)
        P.flag("transitions", self.transitions)
        P.integer("min_arrivals", self.min_arrivals, 1)
        P.number("survival_threshold", self.survival_threshold, 0.0, 1.0)
        P.number("horizon_s", self.horizon_s, 0.0, lo_open=True)


class Scorer:
    def __init__(self, p: AnchorParams, view: "ModelView"):
        self.p = p
        self.view = view

    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        p = self.p
        if not p.enabled:
            return None, 1.0, 0.0
        v = self.view
        a = g.agent
        T = None
        if a.n >= p.min_arrivals and a.ia < INF:
            T = min(a.ia, max(0.0, now - a.last_s))
        if T is not None:
            gap = v.step_gap
            if p.transitions and v.transitions_open() and gap > 0:
                rate = v.call_rate(a.fp)
                if rate > 0:
                    T = min(T, gap / rate)
            thr = p.survival_threshold
            if thr > 0 and T > 0 and -math.expm1(-p.horizon_s / T) < thr:
                T = INF  # low survival
        return T, 1.0, 0.0
