"""Stall forecaster: how long a session stays in its tool call, learned online from the
cachewise gap predictor (``anchorage.policies.gap_predictor``), with TokenCake's fallbacks.

Specification
-------------
``observe(gap_s, tool, args)``: a measured stall (turn end to the session's next request)
feeds the gap histograms per tool and per (tool, argument cluster)
(``anchorage.policies.tool_clusters.ArgClusterer``), and a per-tool EWMA (weight 0.2).

``predict(tool, args, elapsed_s=0)``: the remaining stall ``E[tau - e | tau > e]`` from the
most specific histogram with at least ``min_samples`` (default 8) stalls; else the tool's
EWMA once it has one stall (TokenCake: after the first observed execution); else
``default_s`` (default 1 s, the conservative system-wide constant; a user estimate per
tool may be given in ``estimates``, and it is blended 50/50 with the EWMA once history
exists, as in TokenCake's forecasting).

``IdleEstimate`` (the one source of these settings: ``anchorage.tiering.params``'s
``TemporalParams`` extends it, and the simulator's ``TieringConfig`` extends that): the
idle time of a stalled
session's KV, ``idle_s(stall, wait)`` = the forecaster's stall plus, with ``queue_wait``
(default True), the measured admission wait (a returned request's prefix stays free and
evictable until it is admitted); the wait is an EWMA of arrival-to-admission times,
``next_wait(wait, waited)`` with weight ``wait_ewma`` (default 0.2, in (0, 1]);
``forecaster()`` builds the ``StallForecaster`` with ``default_stall_s`` (default 1 s).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from anchorage.policies.gap_predictor import GapPredictor
from anchorage.policies.tool_clusters import ArgClusterer


class StallForecaster:
    def __init__(self, min_samples: int = 8, default_s: float = 1.0, ewma: float = 0.2,
                 estimates: Mapping[Hashable, float] | None = None):
        self.gaps = GapPredictor(min_samples=min_samples, max_keys=256)
        self.clusters = ArgClusterer()
        self.default_s = default_s
        self.w = ewma
        self.estimates = dict(estimates or {})
        self.ewma: dict[Hashable, float] = {}
        self.observed = 0

    def cluster(self, tool: Hashable | None, args: Any) -> Hashable | None:
        """The argument cluster of a call of ``tool`` (None without arguments)."""
        if tool is None or args is None:
            return None
        return self.clusters.cluster(tool, args)

    def observe(self, gap_s: float, tool: Hashable | None, args: Any = None) -> None:
        gap_s = max(0.0, gap_s)
        self.gaps.observe(gap_s, tool, self.cluster(tool, args))
        old = self.ewma.get(tool)
        self.ewma[tool] = gap_s if old is None else (1 - self.w) * old + self.w * gap_s
        self.observed += 1

    def predict(self, tool: Hashable | None, args: Any = None, elapsed_s: float = 0.0) -> float:
        h = self.gaps.specific(tool, self.cluster(tool, args)) if tool is not None else None
        if h is not None:
            return h.remaining(elapsed_s)
        est = self.estimates.get(tool)
        hist = self.ewma.get(tool)
        if hist is not None:
            base = hist if est is None else 0.5 * (hist + est)
        else:
            base = est if est is not None else self.default_s
        return max(0.0, base - elapsed_s)


@dataclass(frozen=True, kw_only=True)
class IdleEstimate:
    default_stall_s: float = 1.0
    queue_wait: bool = True
    wait_ewma: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.wait_ewma <= 1:
            raise ValueError("wait_ewma must be in (0, 1]")

    def forecaster(self) -> StallForecaster:
        return StallForecaster(default_s=self.default_stall_s)

    def next_wait(self, wait_s: float, waited_s: float) -> float:
        """The admission-wait EWMA after a first admission that waited ``waited_s``."""
        w = self.wait_ewma
        return (1 - w) * wait_s + w * max(0.0, waited_s)

    def idle_s(self, stall_s: float, wait_s: float) -> float:
        """The predicted idle time of a stalled session's KV."""
        return stall_s + wait_s if self.queue_wait else stall_s
