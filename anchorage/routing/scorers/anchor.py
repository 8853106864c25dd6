"""``anchor``: prefer a replica that reports the request's agent anchor as cached.

``score_r = 1`` if the replica lists the request's agent (``agent_id`` over its first
``anchor_blocks`` block keys, default 4) in ``extra["anchors"]`` (what its node agent
publishes), else 0."""

from __future__ import annotations

from anchorage.routing.agent import agent_label
from anchorage.routing.keys import agent_id
from anchorage.routing.scorers.base import Scorer


class AnchorScorer(Scorer):
    def __init__(self, anchor_blocks: int = 4) -> None:
        self.anchor_blocks = anchor_blocks

    def score(self, ctx, reps, pos):
        label = agent_label(agent_id(ctx, self.anchor_blocks))
        return [1.0 if label in reps[p].extra.get("anchors", ()) else 0.0 for p in pos]


SCORERS = {"anchor": AnchorScorer}
