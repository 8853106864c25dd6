"""Cache turnover: how long the pool takes to evict its whole capacity (one estimator).

Specification
-------------
Input: the cumulative number of cached blocks the pool evicted, ``total``, and the clock,
``now`` (policy clock in the simulator, wall clock in vLLM), reported with
``observe(total, now)``; the pool's capacity in blocks, ``capacity``.

The clock starts at ``start_s`` (default None: at the first ``observe`` call, which the
caller makes at its first eviction; the eviction count starts at zero there, so that
eviction counts as the first of the turnover). Each time ``total`` passes another
``capacity`` evictions since the last mark, the time since the mark is one sample ``dt``:

    ``T <- dt`` for the first sample, else ``T <- (1 - w) T + w dt``    (``w`` = 0.3)

``turnover_s`` is ``T``, ``inf`` before the first sample. ``estimate_s(total, now)`` is
``T`` once sampled; before that, the turnover the evictions so far extrapolate to,
``(now - start) * capacity / total`` (0 while they all happened at the start, ``inf``
before the first), for readers that need a time scale from the first eviction on. ``observe`` may be called at every
eviction (exact sample times) or lazily with the cumulative count (each sample then carries
the time of the call that saw it). O(1) amortised per call; three numbers of state.

Used by the eviction policies (re-scoring interval, ``reach_steps="turnover"``), the
simulator's host tier and the engine's temporal controller: the same quantity, one home.
"""

from __future__ import annotations

import math

INF = math.inf


class TurnoverEstimator:
    __slots__ = ("capacity", "weight", "turnover_s", "_mark", "_t")

    def __init__(self, capacity: int = 1, *, weight: float = 0.3,
                 start_s: float | None = None):
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight!r}")
        self.capacity = max(1, int(capacity))
        self.weight = weight
        self.turnover_s = INF
        self._mark = 0
        self._t = start_s

    @property
    def started(self) -> bool:
        return self._t is not None

    def observe(self, total: int, now: float) -> float:
        """``total`` evictions so far at ``now``; returns ``turnover_s``."""
        if self._t is None:
            self._t = now
        cap = self.capacity
        while total - self._mark >= cap:
            self._mark += cap
            dt = now - self._t
            self._t = now
            w = self.weight
            self.turnover_s = dt if self.turnover_s == INF else (1.0 - w) * self.turnover_s + w * dt
        return self.turnover_s

    def estimate_s(self, total: int, now: float) -> float:
        """``turnover_s``, or before its first sample the extrapolation of ``total``
        evictions since the start to ``capacity`` (module spec)."""
        if self.turnover_s != INF:
            return self.turnover_s
        if self._t is None or total <= 0:
            return INF
        return max(0.0, now - self._t) * self.capacity / total

    def survival_s(self, free_blocks: int) -> float:
        """How long a block freed now stays cached behind ``free_blocks`` cached free
        blocks at the measured eviction rate (capacity / turnover); inf before the first
        turnover."""
        if self.turnover_s == INF:
            return INF
        return self.turnover_s * max(0, free_blocks) / self.capacity
