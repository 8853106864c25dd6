"""Output scorer: blocks filled by generated tokens, evicted first once learned dead.

Formula
-------
Group ``output(s)``: session ``s``'s blocks cached from generated tokens. Their reuse
frequency is learned over all output blocks cached (``n``) and hit again (``r``):
``(r + 1) / (n + 2)``. With ``dead_outputs`` on, once ``n >= dead_min_samples`` (64) and
that frequency is below ``dead_max_reuse`` (0.02): ``T = inf``. With gaps on, the outputs
of an ended session: ``T = inf``. Otherwise recency.
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
class OutputParams:
    dead_outputs: bool = True     # signal ``dead_outputs``
    gaps: bool = True             # signal ``gaps`` (ended sessions)
    dead_min_samples: int = 64
    dead_max_reuse: float = 0.02

    def __post_init__(self) -> None:
        P.flag("dead_outputs", self.dead_outputs)
        P.flag("gaps", self.gaps)
        P.integer("dead_min_samples", self.dead_min_samples, 0)
        P.number("dead_max_reuse", self.dead_max_reuse, 0.0, 1.0)


def is_dead(n: int, hits: int, min_samples: int, max_reuse: float) -> bool:
    """``n >= min_samples`` blocks seen and reuse frequency ``(hits + 1) / (n + 2)`` below
    ``max_reuse`` (output and stale blocks)."""
    return n >= min_samples and (hits + 1) / (n + 2) < max_reuse


class Scorer:
    def __init__(self, p: OutputParams, view: "ModelView"):
        self.p = p
        self.view = view

    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        p = self.p
        out = self.view.outputs
        if p.dead_outputs and is_dead(out.n, out.hits, p.dead_min_samples, p.dead_max_reuse):
            return INF, 1.0, 0.0
        if p.gaps and g.sess.ended:
            return INF, 1.0, 0.0
        return None, 1.0, 0.0
