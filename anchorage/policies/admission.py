"""Prefix-aware admission order (CacheWise section 5.1) with a TTFT target: pure; used by
the vLLM scheduler and the simulator.

Specification
-------------
Among waiting requests, admit first the one that needs the fewest *new* blocks
``a_i(t) = blocks(prompt_i) - cached_prefix_blocks_i(t)`` (it reuses what is resident and
disturbs other sessions' caches least; it also approximates shortest-job-first). Aging
keeps anything from starving: the priority is

    ``a_i(t) - (t - arrival_i) / aging_s_per_block``

(smaller first; ties by arrival). With the default ``aging_s_per_block = 0.05`` a request
gains one block of priority per 50 ms waited, so a 2,000-block prompt is admitted before
fresh small ones after 100 s at most. Pure function of its inputs; O(n log n).

Aging bound (what makes starvation impossible): all requests age at the same rate, so
at any instant request ``r`` precedes every request ``s`` that arrived more than
``aging_s_per_block * a_r`` seconds after it (``a_s >= 0``). Hence once ``r`` has waited
``overtake_window_s(a_r) <= aging_s_per_block * blocks(prompt_r)`` seconds, no newcomer is
ever placed before it: ``r`` waits at most that window plus the service of the finitely
many requests that arrived before the window closed.

TTFT target (``AdmissionParams.ttft_target_s = D``; None: the order above alone). The order
above trades the tail for throughput: a prompt with little cached waits while cached ones
pass it, and under load it misses the latency target every turn is judged by. With a
target, each waiting request is in one of three classes by how long it has waited, ``w``:

- *urgent*: ``urgent_frac * D <= w < D`` (it can still make the target if admitted now), or
  ``w >= late_after * D`` (it has waited too long whatever the target): first, in arrival
  order (the earliest deadline first);
- *on time*: ``w < urgent_frac * D``: next, in the aged prefix-aware order;
- *late*: ``D <= w < late_after * D``: last, in the aged prefix-aware order. It has missed
  the target already; admitting it ahead of the rest would make them miss too (the
  measure is the share of turns within the target).

Bound: a request that has waited ``urgent_frac * D`` is placed before every request that
arrived after it, except while it is late; so once it has waited ``late_after * D``, no
later arrival passes it again. The order changes with time alone only when a request
crosses one of the three thresholds (``next_change_s``).

In the engine (``anchorage.node_agent.scheduler``) ``a_i`` is recomputed from vLLM's
prefix cache at every scheduling step; requests vLLM must resume first (preempted, or
waiting on something other than a free slot) keep their place ahead of the rest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

T = TypeVar("T")


def admission_priority(new_blocks: int, waited_s: float, aging_s_per_block: float = 0.05) -> float:
    if aging_s_per_block <= 0:
        raise ValueError("aging_s_per_block must be positive")
    return new_blocks - max(0.0, waited_s) / aging_s_per_block


@dataclass(frozen=True)
class AdmissionParams:
    """The order's parameters (module specification); ``from_dict`` rejects unknown names."""

    aging_s_per_block: float = 0.05
    ttft_target_s: float | None = None
    urgent_frac: float = 0.5
    late_after: float = 4.0

    def __post_init__(self) -> None:
        if not self.aging_s_per_block > 0:
            raise ValueError(f"aging_s_per_block must be positive, got {self.aging_s_per_block}")
        if self.ttft_target_s is not None and not self.ttft_target_s > 0:
            raise ValueError(f"ttft_target_s must be positive (or None), got "
                             f"{self.ttft_target_s}")
        if not 0 <= self.urgent_frac <= 1:
            raise ValueError(f"urgent_frac must be within [0, 1], got {self.urgent_frac}")
        if not self.late_after >= 1:
            raise ValueError(f"late_after must be >= 1 (a multiple of the target), got "
                             f"{self.late_after}")

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "AdmissionParams":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown admission parameter(s) {', '.join(unknown)}; known: "
                             + ", ".join(sorted(known)))
        return cls(**d)  # type: ignore[arg-type]

    def thresholds_s(self) -> tuple[float, ...]:
        """Waiting times at which a request changes class (empty without a target)."""
        d = self.ttft_target_s
        return () if d is None else (self.urgent_frac * d, d, self.late_after * d)

    def klass(self, waited_s: float) -> int:
        """0 urgent, 1 on time, 2 late (module specification); 1 without a target."""
        d = self.ttft_target_s
        if d is None or waited_s < self.urgent_frac * d:
            return 1
        if waited_s < d or waited_s >= self.late_after * d:
            return 0
        return 2


def admission_order(waiting: Sequence[T], new_blocks: Callable[[T], int],
                    arrival_s: Callable[[T], float], now_s: float,
                    aging_s_per_block: float = 0.05,
                    params: AdmissionParams | None = None) -> list[T]:
    """``waiting`` in admission order (first to admit first). ``params`` (when given)
    supersede ``aging_s_per_block``."""
    p = params if params is not None else AdmissionParams(aging_s_per_block)
    aging = p.aging_s_per_block
    keyed = []
    for i, r in enumerate(waiting):
        t = arrival_s(r)
        k = p.klass(now_s - t)
        prio = 0.0 if k == 0 else admission_priority(new_blocks(r), now_s - t, aging)
        keyed.append((k, prio, t, i, r))
    keyed.sort(key=lambda x: x[:4])
    return [x[4] for x in keyed]


def next_change_s(arrivals: Iterable[float], now_s: float, params: AdmissionParams) -> float:
    """The first time after ``now_s`` at which one of the requests that arrived at
    ``arrivals`` changes class (``inf``: never, or no target): until then the order of
    ``admission_order`` changes only when requests arrive or the cache changes."""
    ths = params.thresholds_s()
    if not ths:                           # no target: time alone never changes the order
        return math.inf
    nxt = math.inf
    for t in arrivals:
        for th in ths:                    # ascending: the first one ahead is this one's next
            if t + th > now_s:
                nxt = min(nxt, t + th)
                break
    return nxt


def overtake_window_s(new_blocks: int, aging_s_per_block: float = 0.05) -> float:
    """Requests arriving more than this many seconds after a request needing ``new_blocks``
    new blocks are never ordered before it (the aging bound of the specification)."""
    if aging_s_per_block <= 0:
        raise ValueError("aging_s_per_block must be positive")
    return max(0, new_blocks) * aging_s_per_block
