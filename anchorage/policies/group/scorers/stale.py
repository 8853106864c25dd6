"""Stale scorer: a thread's free blocks that the session's next prompt skipped.

Formula
-------
Group ``stale(s, i)`` (signal ``stale``): when a request of session ``s`` reaches its
``thread(s, f)``, the thread's free blocks the prompt did not hit and does not hold
further on (a branch the conversation left, a compacted history) go to a new stale group
(one per such event, so each stays in free order). ``q`` is the learned probability that
a skipped block is requested again: ``q = (r + 1) / (n + 2)`` over ``n`` skipped blocks,
``r`` counting hits on them and requests for their keys after eviction while the key is
among the last ``capacity`` evicted stale keys (a ghost list, as ARC's, so ``q`` does not
depend on how long the policy kept them); ``q = 1`` until ``dead_min_samples`` (64)
skipped blocks are seen, floored at ``floor`` (0.02) after.

- dead (``n >= dead_min_samples`` and ``q < dead_max_reuse``, 0.02): ``T = inf``;
- else, with gaps on, ``T = W_s(e) / q`` (the session's wait per expected reuse of a
  skipped block; ``ModelView.session_wait``), and when that is no signal, recency with
  ``mult = 1 / max(P(return | e) * q, floor)`` (``P = 1`` with gaps off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anchorage.policies.group import params as P
from anchorage.policies.group.scorers.output import is_dead

if TYPE_CHECKING:
    from anchorage.policies.group.groups import Group
    from anchorage.policies.group.view import ModelView

INF = math.inf


@dataclass(frozen=True)
class StaleParams:
    gaps: bool = True             # signal ``gaps``
    dead_min_samples: int = 64
    dead_max_reuse: float = 0.02
    floor: float = 0.02

    def __post_init__(self) -> None:
        P.flag("gaps", self.gaps)
        P.integer("dead_min_samples", self.dead_min_samples, 0)
        P.number("dead_max_reuse", self.dead_max_reuse, 0.0, 1.0)
        P.number("floor", self.floor, 0.0, 1.0, lo_open=True)


class Scorer:
    def __init__(self, p: StaleParams, view: "ModelView"):
        self.p = p
        self.view = view

    def score(self, g: "Group", now: float) -> tuple[float | None, float, float]:
        p, v = self.p, self.view
        st = v.stale
        n, hits = st.n, st.hits
        if is_dead(n, hits, p.dead_min_samples, p.dead_max_reuse):
            return INF, 1.0, 0.0
        q = 1.0 if n < p.dead_min_samples else max((hits + 1) / (n + 2), p.floor)
        T = v.session_wait(g.sess, now) if p.gaps else None
        if T is None:
            pr = v.return_probability(g.sess, now) if p.gaps else 1.0
            return None, 1.0 / max(pr * q, p.floor), 0.0
        if T != INF:
            T = T / q
        return T, 1.0, 0.0
