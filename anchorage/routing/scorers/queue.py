"""``queue`` and ``waiting_queue``: prefer the least loaded replica.

- ``queue``: ``score_r = 1 - (load_r - min) / (max - min)`` over the remaining replicas (1
  for all when equal), ``load_r`` = ``anchorage.routing.load.load_score`` (running +
  waiting requests, KV usage, queued prefill tokens).
- ``waiting_queue``: the same over ``waiting_r`` alone (the Gateway API inference
  extension's ``queue-scorer``, on vLLM's waiting-queue size).

No parameters."""

from __future__ import annotations

from anchorage.routing.load import load_score
from anchorage.routing.scorers.base import Scorer


class QueueScorer(Scorer):
    def score(self, ctx, reps, pos):
        loads = [load_score(reps[p]) for p in pos]
        lo, hi = min(loads), max(loads)
        return [1.0] * len(pos) if hi == lo else [1 - (x - lo) / (hi - lo) for x in loads]


class WaitingQueueScorer(Scorer):
    def score(self, ctx, reps, pos):
        q = [reps[p].waiting for p in pos]
        lo, hi = min(q), max(q)
        return [1.0] * len(pos) if hi == lo else [(hi - x) / (hi - lo) for x in q]


SCORERS = {"queue": QueueScorer, "waiting_queue": WaitingQueueScorer}
