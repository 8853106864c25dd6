"""One scorer per group kind: the expected time until a group's next use.

A scorer is a small object built from its typed parameters (a frozen dataclass) and the
workload model's read-only view (``anchorage.policies.group.view.ModelView``):

    ``score(g, now) -> (T, mult, add)``

``T`` is the expected time from the epoch until the group ``g`` is used again (``inf``: not
expected back), or None: no signal, the group is ordered by recency with multiplier
``mult`` and offset ``add`` (``groups`` spec). The policy turns ``T`` into the group's key
(``K = epoch + T``; ``inf`` beyond ``horizon_s``; ``-inf`` while a queued request holds the
group). Each file states its formula: ``anchor``, ``thread``, ``output``, ``stale``,
``dup``, and ``recency`` (blocks never assigned to a group).

A new scorer is a new file here with its ``Params`` and ``Scorer``, its kind in
``groups.KINDS``, and its line in ``build_scorers``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from anchorage.policies.group.config import GroupConfig
    from anchorage.policies.group.groups import Group
    from anchorage.policies.group.view import ModelView

Score = tuple["float | None", float, float]


class Scorer(Protocol):
    def score(self, g: "Group", now: float) -> Score: ...


def build_scorers(cfg: "GroupConfig", view: "ModelView") -> list[Scorer]:
    """The scorers of a configuration, indexed by group kind (``groups.KINDS``)."""
    from anchorage.policies.group.scorers import anchor, dup, output, recency, stale, thread

    return [anchor.Scorer(cfg.anchor, view), thread.Scorer(cfg.thread, view),
            output.Scorer(cfg.output, view), stale.Scorer(cfg.stale, view),
            dup.Scorer(), recency.Scorer()]
