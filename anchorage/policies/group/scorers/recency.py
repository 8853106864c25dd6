"""Recency scorer: blocks the policy saw freed but never assigned to a group.

Formula
-------
Group ``anon``: cached blocks freed without a request the policy knows (vLLM allocated
them without a prefix lookup, e.g. its connector path, or they were cached before the
policy was installed). No signal: recency (``mult = 1, add = 0``), so they leave in the
order they were freed, interleaved with the other recency groups exactly as LRU would.
No parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anchorage.policies.group.groups import Group


class Scorer:
    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        return None, 1.0, 0.0
