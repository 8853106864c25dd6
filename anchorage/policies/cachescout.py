"""`cachescout`: agent-aware eviction from learned agent transitions (CacheScout sections
3.2-3.4), made correct for hundreds of concurrent sessions; plus the prefetch advisor.

Specification
-------------
Eviction is a preset of group-scored eviction (``anchorage.policies.group``) with the
agent signals (anchors, transitions, gaps without tool metadata, dead outputs, stale
blocks):

- agents are prompt-prefix fingerprints (``anchorage.fingerprint``: the end of the prefix
  shared across sessions), never the ``agent`` label; tables LRU-capped (``max_agents``
  64);
- transitions are learned **per session** (``anchorage.policies.transitions``, eq. 3 with
  ``eps`` = 0.1), never from the global interleaved order;
- an anchor's expected time to next use aggregates **all active sessions**:
  ``1 / sum_i N_i P(f | i) / g`` (``N_i`` active sessions at agent ``i``, ``g`` mean
  session step gap), and its own arrival history ``max(ia_f, now - last_f)``: anchors
  reused by many sessions are worth more than single-use blocks; anchors nobody is about
  to call and nobody called for longer than usual lose protection. This replaces the
  paper's truncated BFS hop distance (eq. 8) and its per-step recency decay (eq. 9), whose
  scales are wrong when sessions interleave;
- a session's private thread with agent ``f`` is worth the session's expected wait (all
  gaps, no tool metadata) plus ``(steps - 1)`` step gaps, divided by the probability
  ``p`` that the session calls ``f`` within two steps (``TransitionLearner.reach``);
  ended or idle sessions stop protecting their blocks.

Prefetch advisor (section 3.4), over any policy's introspection interface
(``anchorage.policies.base``): ``PrefetchAdvisor(policy).advise(session_id)`` returns the
session's predicted next agent ``argmax_j P(j | current)`` (eq. 10), its probability, the
predictability ``R`` (eq. 2) and whether ``R >= R_min`` (eq. 11; ``r_min``: the policy's
tuned ``r_min`` when it is positive, else 0.3) and prefetch is enabled (the policy's
``prefetch``), and the anchors to warm: the predicted agent's fingerprint when its anchor is
not resident (``anchors_to_warm`` is empty when the gate is closed). ``budget(dt)`` is the
number of warm-ups allowed in ``dt`` seconds (``prefetch_rate_per_s``). ``warm_candidates(k)`` ranks agents
by the expected number of active sessions calling them next. Warm-up requests
(``ctx.warmup``) never update learning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Hashable

from anchorage.policies.base import EvictionPolicy
from anchorage.policies.group import GroupEvictionPolicy, Signals, build_config

INF = math.inf
SIGNALS = Signals(anchors=True, transitions=True, gaps=True, tools=False, dead_outputs=True)


def cachescout(block_size: int = 16, **params: Any) -> GroupEvictionPolicy:
    cfg = build_config("cachescout", params.pop("signals", SIGNALS), block_size=block_size,
                       cluster_fn=params.pop("cluster_fn", None), **params)
    return GroupEvictionPolicy(cfg)


@dataclass
class Advice:
    session_id: Hashable
    current_agent: Hashable | None
    next_agent: Hashable | None
    probability: float
    R: float
    gate_open: bool
    anchors_to_warm: list[Hashable] = field(default_factory=list)


class PrefetchAdvisor:
    """Prefetch advice from a policy's learned model, for the sidecar (module spec)."""

    def __init__(self, policy: EvictionPolicy, r_min: float | None = None):
        self.policy = policy
        s = policy.prefetch_settings()
        if r_min is None:  # the policy's tuned gate when it has one, else the paper's 0.3
            r_min = s.r_min or 0.3
        self.r_min = r_min
        self.enabled = bool(s.enabled)
        self.rate_per_s = float(s.rate_per_s)

    def budget(self, interval_s: float) -> int:
        """Warm-ups allowed in ``interval_s`` seconds (``prefetch_rate_per_s``; 0 when
        prefetch is disabled)."""
        if not self.enabled:
            return 0
        if self.rate_per_s == INF:
            return 1 << 30
        return int(self.rate_per_s * max(0.0, interval_s))

    def predictability(self) -> float:
        return self.policy.predictability()

    def _resident(self, fp: Hashable) -> bool:
        pool = self.policy.pool
        return pool is not None and fp in pool.cached

    def advise(self, session_id: Hashable) -> Advice:
        pol = self.policy
        cur = pol.session_agent(session_id)
        R = self.predictability()
        nxt, p = pol.next_agent(cur) if cur is not None else (None, 0.0)
        gate = self.enabled and R >= self.r_min
        warm = [nxt] if (gate and nxt is not None and not self._resident(nxt)) else []
        return Advice(session_id, cur, nxt, p, R, gate, warm)

    def warm_candidates(self, k: int = 3) -> list[tuple[Hashable, float]]:
        """Agents ranked by expected number of active sessions calling them next."""
        return self.policy.predicted_agents(k)


POLICIES = {"cachescout": cachescout}
