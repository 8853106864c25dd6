"""Dup scorer: duplicates, evicted before everything else that is scored.

Formula
-------
Group ``dup(s, i)`` (signal ``stale``): when a request of session ``s`` reaches its
``thread(s, f)``, the thread's free blocks the prompt did not hit but holds further on
(behind an evicted block, so the request recomputes them into new blocks) are
duplicates: ``T = inf``. No parameters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anchorage.policies.group.groups import Group

INF = math.inf


class Scorer:
    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        return INF, 1.0, 0.0
