"""Prefix-aware admission order (CacheWise section 5.1): pure; used by the vLLM scheduler.

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

In the engine (``anchorage.node_agent.scheduler``) ``a_i`` is recomputed from vLLM's
prefix cache at every scheduling step; requests vLLM must resume first (preempted, or
waiting on something other than a free slot) keep their place ahead of the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def admission_priority(new_blocks: int, waited_s: float, aging_s_per_block: float = 0.05) -> float:
    if aging_s_per_block <= 0:
        raise ValueError("aging_s_per_block must be positive")
    return new_blocks - max(0.0, waited_s) / aging_s_per_block


def admission_order(waiting: Sequence[T], new_blocks: Callable[[T], int],
                    arrival_s: Callable[[T], float], now_s: float,
                    aging_s_per_block: float = 0.05) -> list[T]:
    """``waiting`` in admission order (first to admit first)."""
    keyed = [(admission_priority(new_blocks(r), now_s - arrival_s(r), aging_s_per_block),
              arrival_s(r), i, r) for i, r in enumerate(waiting)]
    keyed.sort(key=lambda x: x[:3])
    return [x[3] for x in keyed]


def overtake_window_s(new_blocks: int, aging_s_per_block: float = 0.05) -> float:
    """Requests arriving more than this many seconds after a request needing ``new_blocks``
    new blocks are never ordered before it (the aging bound of the specification)."""
    if aging_s_per_block <= 0:
        raise ValueError("aging_s_per_block must be positive")
    return max(0, new_blocks) * aging_s_per_block
