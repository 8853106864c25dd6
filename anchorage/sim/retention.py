"""KV retention after a turn (Continuum's time-to-live pins) and program-level FCFS: the
decisions, and the per-replica state the simulator's scheduler keeps for them.

Specification (Continuum, Li et al., arXiv:2511.02230; the released scheduler,
``vllm-continuum`` ``vllm/v1/core/estimate_with_func.py`` ``ToolCallEstimator.set_up_pin``
and ``vllm/v1/core/sched/scheduler.py``):

- Tool-time estimate per tool name: the mean of the observed gaps (a session's next
  request arrival minus its previous request's completion, when that request called the
  tool), learned online (``observe``); unknown tools estimate 0.
- ``pin_ttl_s(tool)``: a request that ends in a tool call whose estimate is at most
  ``threshold_s`` (``FIXED_THRESHOLD_CONTINUUM`` = 2 s) keeps its KV pinned for ``ttl_s``
  (2 s): its blocks stay allocated (not freed, not evictable); other requests, and those
  without a tool call, free their blocks as usual.
- A pin is released when it has expired and the session has no request waiting on this
  replica (``unpin_requests_regular``), checked at every step plan; when a running
  request would have to be preempted, the pin that expires last is released first.
- Program-level FCFS (``admission = "program-fcfs"``, scheduler policy ``continuum``):
  the waiting queue is ordered by the time the request's session first arrived at the
  replica (then by arrival), preempted requests first; the preemption victim is the
  running request whose session arrived last.

- ``yield_to_waiting`` (off for Continuum, which makes a waiting request wait for the
  pins' expiry): when the waiting queue's head does not fit, the pin that expires last is
  released first, until it fits or no pin is left. This models a baseline that keeps a
  stalled agent's KV resident only while no other request needs the memory (the vLLM
  baselines of the TokenCake paper; with an unbounded ``ttl_s`` and no yielding such a
  replica deadlocks once stalled agents hold every block).

Parameters: ``ttl_s`` 2.0, ``threshold_s`` 2.0, ``yield_to_waiting`` False.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PinParams:
    ttl_s: float = 2.0
    threshold_s: float = 2.0
    yield_to_waiting: bool = False

    def __post_init__(self) -> None:
        if self.ttl_s < 0 or self.threshold_s < 0:
            raise ValueError("ttl_s and threshold_s must be >= 0")


def pin_ttl_s(tool: Hashable | None, estimate_s: float | None, p: PinParams = PinParams()) -> float:
    """Seconds a turn's KV stays pinned: ``ttl_s`` after a tool call whose estimated
    duration (None: unknown, 0) is at most ``threshold_s``, else 0."""
    if tool is None:
        return 0.0
    return p.ttl_s if (estimate_s or 0.0) <= p.threshold_s else 0.0


@dataclass
class ToolTimes:
    """The per-tool mean of observed tool gaps (Continuum's estimator)."""

    sums: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)

    def observe(self, tool: Hashable, gap_s: float) -> None:
        self.sums[tool] = self.sums.get(tool, 0.0) + gap_s
        self.counts[tool] = self.counts.get(tool, 0) + 1

    def estimate(self, tool: Hashable) -> float | None:
        n = self.counts.get(tool)
        return self.sums[tool] / n if n else None


class ContinuumPins:
    """One replica's pins (the engine calls it; ``anchorage.sim.engine.Replica``)."""

    def __init__(self, params: PinParams = PinParams()) -> None:
        self.p = params
        self.times = ToolTimes()
        self.pins: dict[Hashable, tuple[object, float]] = {}  # session -> (alloc, until)
        self._last: dict[Hashable, tuple[Hashable, float]] = {}  # session -> (tool, end)
        self.pinned = self.released_early = 0

    def on_arrival(self, session: Hashable, now: float) -> None:
        last = self._last.pop(session, None) if session is not None else None
        if last is not None:
            self.times.observe(last[0], now - last[1])

    def on_complete(self, session: Hashable, tool: Hashable | None, now: float) -> float:
        """The pin deadline for a request that just completed (0: free its blocks)."""
        if session is None:
            return 0.0
        if tool is not None:
            self._last[session] = (tool, now)
        ttl = pin_ttl_s(tool, self.times.estimate(tool) if tool is not None else None, self.p)
        return now + ttl if ttl > 0 else 0.0

    def next_expiry_s(self) -> float:
        return min((u for _, u in self.pins.values()), default=float("inf"))

    def expired(self, now: float, waiting_sessions: set) -> list[Hashable]:
        return [s for s, (_, u) in self.pins.items() if u <= now and s not in waiting_sessions]

    def latest(self) -> Hashable | None:
        return max(self.pins, key=lambda s: self.pins[s][1]) if self.pins else None
