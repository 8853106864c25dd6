"""The spatial policy (TokenCake section 5) over one simulated replica, for ``tokencake``:
the hooks ``anchorage.tiering.replica.SimTiering`` forwards.

Specification
-------------
Every ``spatial_interval_s`` (checked at each step plan, ``update``): agent scores
(``anchorage.tiering.spatial.agent_scores``) from the learned transition graph (``flow``:
a session's consecutive agents, ``transition``), queueing (waiting requests per agent),
usage (blocks held by running requests per agent) and active sessions (running, waiting,
and stalled ones); criticality = score / top score; the reserved pool sized from the
pressure (``reserved_fraction``) and split among the critical agents
(``split_reservation``), applied with ``TieredEviction.set_reservation``. Admission
(``order_waiting``, once after each change of the queue or of the scores): preempted
requests first, then ``admission_rank`` by criticality-boosted arrival. Reported: the
reserved blocks per agent, summed and maximal over updates (``reserved_sum``,
``reserved_max``, ``updates``). Agents: ``agent_of(ctx)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable

from anchorage.policies.base import RequestContext
from anchorage.policies.transitions import TransitionLearner
from anchorage.tiering import spatial as sp
from anchorage.tiering.eviction import TieredEviction
from anchorage.tiering.params import TieringConfig


class SimSpatial:
    def __init__(self, rep, cfg: TieringConfig, policy: TieredEviction,
                 agent_of: Callable[[RequestContext], Hashable]):
        self.rep = rep
        self.cfg = cfg
        self.policy = policy
        self.agent_of = agent_of
        self.trans = TransitionLearner()
        self.crit: dict[Hashable, float] = {}
        self.sorted = True
        self._next = 0.0
        self.reserved_sum: Counter = Counter()
        self.reserved_max: Counter = Counter()
        self.updates = 0

    def transition(self, prev: Hashable, agent: Hashable) -> None:
        self.trans.observe(prev, agent)

    def criticality(self, agent: Hashable) -> float:
        return self.crit.get(agent, 0.0)

    def due(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self.cfg.spatial_interval_s
        return True

    def order_waiting(self) -> None:
        if self.sorted or not self.crit:
            return
        self.sorted = True
        w = self.rep.waiting
        if len(w) < 2:
            return
        crit, agent_of = self.crit, self.agent_of
        boost = self.cfg.spatial.boost_s
        items = sorted(w, key=lambda r: sp.admission_rank(
            r.preemptions > 0, crit.get(agent_of(r.ctx), 0.0), r.arrival_s, boost))
        w.clear()
        w.extend(items)

    def update(self, now: float, stalled: Iterable[Hashable], load: Callable[[], float]) -> None:
        """New scores and reservation; ``stalled``: the agents of stalled sessions;
        ``load()``: the replica's pressure."""
        rep, agent_of = self.rep, self.agent_of
        usage: Counter = Counter()
        queue: Counter = Counter()
        active: Counter = Counter()
        for r in rep.running:
            a = agent_of(r.ctx)
            if r.alloc is not None:
                usage[a] += len(r.alloc.blocks)
            active[a] += 1
        for r in rep.waiting:
            a = agent_of(r.ctx)
            queue[a] += 1
            active[a] += 1
        for a in stalled:
            active[a] += 1
        agents = set(usage) | set(queue) | set(active)
        if not agents:
            return
        flow = sp.transition_flow(self.trans, agents)
        scores = sp.agent_scores(flow, queue, usage, active, self.cfg.weights)
        self.crit = sp.criticality(scores)
        self.sorted = False
        p = self.cfg.spatial
        cap = rep.pool.capacity_blocks
        total = int(sp.reserved_fraction(load(), p) * cap)
        shares = sp.split_reservation(total, sp.critical_agents(scores, p), usage, scores, p)
        self.policy.set_reservation(shares, now)
        self.updates += 1
        for a, n in shares.items():
            self.reserved_sum[a] += n
            self.reserved_max[a] = max(self.reserved_max[a], n)
