"""``prefix`` and ``precise_prefix``: prefer the replica holding the longest cached prefix.

``score_r = m_r / len(keys)``, ``m_r`` the number of the request's leading block keys the
replica holds. ``prefix`` models each replica's cache from the router's own decisions
(an LRU of ``capacity_blocks`` per replica, default 100,000, or the replica's reported
capacity); ``precise_prefix`` reads the replicas' KV events instead (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``), so it sees evictions. 0 for a request without keys.
"""

from __future__ import annotations

from anchorage.routing.prefix_index import PrefixIndex
from anchorage.routing.scorers.base import Scorer


class PrefixScorer(Scorer):
    def __init__(self, capacity_blocks: int = 100_000, from_events: bool = False) -> None:
        self.from_events = from_events
        self.index = PrefixIndex(None if from_events else capacity_blocks)
        self._capacity = capacity_blocks

    def score(self, ctx, reps, pos):
        keys = ctx.keys
        if not keys:
            return [0.0] * len(pos)
        if not self.from_events:
            for p in pos:
                self.index.set_capacity(reps[p].index, reps[p].capacity_blocks or self._capacity)
        m = self.index.match(keys)
        return [m.get(reps[p].index, 0) / len(keys) for p in pos]

    def on_start(self, ctx, replica):
        if not self.from_events:
            self.index.insert(replica, ctx.keys)

    def on_kv_event(self, replica, event):
        if self.from_events:
            self.index.apply_event(replica, event)

    def on_replica_removed(self, replica):
        self.index.clear(replica)

    def predicted_hit_blocks(self, ctx, replica):
        return self.index.match_len(replica, ctx.keys)


SCORERS = {"prefix": PrefixScorer,
           "precise_prefix": lambda **kw: PrefixScorer(from_events=True, **kw)}
