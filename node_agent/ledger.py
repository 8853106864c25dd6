"""The sidecar's warm-up ledger: what became of each warm-up (pure: snapshot and cache
state in, counts out).

A warm-up of agent ``a`` that completed at ``done_s`` is

- ``used`` when a real request with ``a``'s fingerprint arrived after ``done_s`` (the
  plugin stamps the anchor's ``last_seen_s``) and before the anchor's last block left the
  cache (``CacheTracker.removed_since``);
- ``wasted`` when the block left first and the plugin has reported every request up to
  that removal (its snapshot was written after it), when a newer warm-up of ``a``
  superseded it, when the ledger is full (``max_pending``, oldest first), or when nothing
  came within ``horizon_s``.

Until then it is pending (at most one per agent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from anchorage.node_agent.kv_events import CacheTracker
from anchorage.node_agent.snapshot import Snapshot


@dataclass(frozen=True)
class Pending:
    agent: str
    key: int          # the anchor's last block key (node_agent.kv_events.anchor_key)
    done_s: float


class WarmupLedger:
    def __init__(self, horizon_s: float = 600.0, max_pending: int = 1024):
        self.pending: dict[str, Pending] = {}
        self.horizon_s = horizon_s
        self.max_pending = max_pending
        self.used = self.wasted = 0

    def add(self, agent: str, key: int, done_s: float) -> None:
        old = self.pending.pop(agent, None)
        if old is not None:
            self.wasted += 1  # superseded before any use
        self.pending[agent] = Pending(agent, key, done_s)
        while len(self.pending) > self.max_pending:
            self.pending.pop(next(iter(self.pending)))
            self.wasted += 1

    def resolve(self, snap: Snapshot | None, tracker: CacheTracker, now_s: float) -> None:
        anchors = snap.anchor_by_agent if snap is not None else {}
        for agent, p in list(self.pending.items()):
            entry = anchors.get(agent)
            seen = entry.last_seen_s if entry is not None else -math.inf
            gone = tracker.removed_since(p.key, p.done_s)
            if seen > p.done_s and (gone is None or seen <= gone):
                self.used += 1
            elif gone is not None and snap is not None and snap.written_s >= gone:
                self.wasted += 1  # the plugin has reported every request up to the eviction
            elif now_s - p.done_s > self.horizon_s:
                self.wasted += 1
            else:
                continue
            del self.pending[agent]
