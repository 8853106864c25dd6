"""``session``: keep a session on the replica that served it last.

``score_r = 1`` for the replica that last served the request's ``(tenant, session_id)``,
else 0 (0 for all without a session id). The table is an LRU bounded in entries
(``max_sessions``, default 200,000) and bytes (``max_table_bytes``, default 64 MiB)."""

from __future__ import annotations

from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.scorers.base import Scorer


class SessionScorer(Scorer):
    def __init__(self, max_sessions: int = 200_000, max_table_bytes: int = 64 << 20) -> None:
        self.max_sessions = max_sessions
        self.last = BoundedLRU(max_sessions, max_table_bytes)

    def score(self, ctx, reps, pos):
        r = self.last.get((ctx.tenant, ctx.session_id)) if ctx.session_id is not None else None
        return [1.0 if reps[p].index == r else 0.0 for p in pos]

    def on_start(self, ctx, replica):
        if ctx.session_id is not None:
            self.last[(ctx.tenant, ctx.session_id)] = replica


SCORERS = {"session": SessionScorer}
