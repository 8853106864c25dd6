"""``kv_usage``: prefer the replica with the most free KV cache.

``score_r = 1 - kv_usage_r`` (clipped to [0, 1]). No parameters."""

from __future__ import annotations

from anchorage.routing.scorers.base import Scorer


class KVUsageScorer(Scorer):
    def score(self, ctx, reps, pos):
        return [1.0 - min(1.0, max(0.0, reps[p].kv_usage)) for p in pos]


SCORERS = {"kv_usage": KVUsageScorer}
