"""The scorer interface of the ``composite`` router (``anchorage.routing.scorers`` spec)."""

from __future__ import annotations

from typing import Any, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView

Positions = list[int]


class Scorer:
    """``score`` returns one value in [0, 1] per position of ``pos`` (higher: better);
    the hooks mirror the ``Router`` ones and default to nothing."""

    def score(self, ctx: RequestContext, reps: Sequence[ReplicaView], pos: Positions) -> list[float]:
        raise NotImplementedError

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        pass

    def on_kv_event(self, replica: int, event: Any) -> None:
        pass

    def on_replica_removed(self, replica: int) -> None:
        pass

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int | None:
        """Blocks of ``ctx`` this scorer predicts cached on ``replica`` (None: no opinion)."""
        return None
