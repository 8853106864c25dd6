"""Prefix-aware admission order (CacheWise section 5.1) for the engine simulator.

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
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

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
