"""``agent``: place each agent's anchor on a few replicas sized by its load; sessions stick.

Anchors (system prompt, tools, skills) are reused by every session of an agent. Scattering
them over every replica (round robin, load balancing) makes each replica's cache hold
every anchor, cold; ``prefix`` routing concentrates them but by accident of history. This
policy decides the placement explicitly.

Spec, per request ``q`` at time ``t`` over the healthy replicas ``H`` (``n = |H|``):

- Agent ``a(q)``: the client's hint scoped by tenant, else the chained key of the
  request's first ``anchor_blocks`` blocks (``keys.agent_id``).
- Load: ``L_a`` = requests of ``a``, exponentially decayed with half-life ``half_life_s``;
  ``L`` = the same over all agents. Target spread ``k_a = clamp(ceil(spread * n * L_a / L),
  1, n)``: an agent with a share ``s`` of traffic gets about ``s * n`` replicas. While
  ``L < warmup_per_replica * n`` shares are noise and ``k_a = 1`` (load spills still grow).
- Placement ``P_a`` (ordered set of replicas holding ``a``'s anchor). When
  ``|P_a| < k_a`` it grows by the replica that (1) already reports ``a``'s anchor in its
  policy state (``ReplicaView.extra["anchors"]``, labels from ``agent_label``; an
  ``fp:`` label of any key of the request's prefix counts, whatever anchor length the
  replica's policy learned) or holds it
  in the router's prefix model, then (2) has the least committed load
  ``C_r = sum_{b: r in P_b} L_b / |P_b|``, then (3) the least current load. When
  ``|P_a| > k_a + 1`` (hysteresis) the newest member is dropped. Each replica so holds
  about ``spread * (#anchors) / n`` anchors, weighted by heat.
- Load: ``load_r = load_score(r)`` (``anchorage.routing.load``): running + waiting
  requests + queued prefill tokens / ``tokens_per_request`` + KV usage, so a replica with
  a few huge prompts queued counts as busy as one with many small ones.
- Overload: ``load_r > spill_ratio * mean(load) + spill_abs`` or
  ``kv_usage_r >= kv_spill``.
- Thread: the history a request extends is its *thread* ``(tenant, session, a)``: a
  multi-agent session's prompt for agent ``a`` is ``anchor(a)`` + the session's shared
  context, so it extends ``a``'s previous prompt in that session and shares no block with
  another agent's prompt (a different anchor starts the chain). A single-agent session is
  one thread. Sticking per session instead would drag every agent of a session, and its
  anchor, onto the session's replica.
- Work of a prefix: ``w(m) = m * input_length / len(keys) / tokens_per_request`` for
  ``m`` blocks (request equivalents of prefill; 0 when ``tokens_per_request = 0``).
- Decision: (1) a known thread goes to its replica ``h`` (the one holding its history)
  unless ``h`` is gone, or ``h`` is overloaded *and* ``load_h - min(load) > w(m_h)``
  (``m_h``: the thread's blocks the router's model holds on ``h``): moving re-prefills the
  history elsewhere, so a long thread waits out a burst that a short one escapes;
  (2) otherwise, to the member of ``P_a`` that is not
  overloaded with the longest prefix match in the router's model (the thread's history
  when it moved), then least load; a *new* thread (no history to lose) treats members as
  overloaded when the lightest member's load exceeds ``new_ratio * min(load) + new_abs +
  w(anchor blocks matched there)`` over all replicas; (3) if every member is overloaded, spill: add the
  least loaded non-member to ``P_a`` (re-place the anchor there) and route there; if
  ``P_a = H``, the least loaded replica. The thread is (re)bound to the choice.
  ``decisions`` counts the paths taken (``thread``, ``member``, ``spill``).

Parameters: ``anchor_blocks`` (4), ``half_life_s`` (60), ``spread`` (1.0),
``warmup_per_replica`` (8), ``new_ratio`` (2; 0 disables), ``new_abs`` (4),
``spill_ratio`` (1.5), ``spill_abs`` (4), ``kv_spill`` (0.98), ``max_sessions``
(threads remembered, 200_000, LRU), ``capacity_blocks`` (prefix model per replica when the
view has none, 100_000), ``min_agent_load`` (1e-3: placements of agents decayed below it
are forgotten), ``tokens_per_request`` (2048; 0: request counts only).

Measured (``bench/bench_router_sim.py``, random topology, 400 sessions, hybrid eviction,
4 replicas at the knee; ``anchorage.routing.analysis`` splits the misses): ``agent`` trails
one pooled cache by 8.8 points: 3.9 of placement (histories left on another replica when
a thread moved under load; anchors 0.1) and 5.1 more capacity misses (its own replica
evicted them), mostly threads waiting 5-30 s on a tool call, flushed while other
requests' running prompts pin the replica's cache (p99 94 % of a 4,000-block replica vs
68 % of the pooled cache, 150-session trace). Diverting new threads less (``new_ratio`` 2
/ ``new_abs`` 4, was 1.25 / 2) gained 1.5 / 1.8 points (4 / 8 replicas) with TTFT p90 at
0.48x / 0.33x round_robin's; never diverting (0) gained 2.3 at 4 replicas but put TTFT
p90 at 0.49x, at the limit; moving threads less (``spill_ratio`` 3) removed most of the
placement loss but put TTFT p90 at 0.57x. With an H200's own KV budget (50,945 blocks per
replica, ``--sim-capacities``), agent reaches 96.5-100.6 % of pooled with TTFT p90 0.04-0.46x
round_robin's, and prefix routing is level with it (-0.6 to +0.2 points). At 4,000 blocks
even Belady on each replica with agent's placement reaches only 86-90 % of pooled hybrid
(``--sim-bound``, ``anchorage.routing.oracle``). Placing new threads by cache footprint
instead of their agent's anchor lost 3.5 points there.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from typing import Hashable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.keys import agent_id
from anchorage.routing.load import TOKENS_PER_REQUEST, load_score, overloaded
from anchorage.routing.prefix_index import PrefixIndex


def agent_label(a: Hashable) -> str:
    """The string a replica uses for agent ``a`` in ``extra["anchors"]``."""
    kind = a[0]
    if kind == "hint":
        return f"{a[1]}/{a[2]}" if a[1] is not None else str(a[2])
    if kind == "fp":
        k = a[1]
        return f"fp:{k:016x}" if isinstance(k, int) and k >= 0 else f"fp:{k}"
    return "empty"


class _Decayed:
    __slots__ = ("value", "t")

    def __init__(self) -> None:
        self.value = 0.0
        self.t = 0.0

    def at(self, now: float, half_life: float) -> float:
        if now > self.t:
            self.value *= 2.0 ** (-(now - self.t) / half_life)
            self.t = now
        return self.value


class AgentRouter(Router):
    name = "agent"

    def __init__(self, anchor_blocks: int = 4, half_life_s: float = 60.0, spread: float = 1.0,
                 spill_ratio: float = 1.5, spill_abs: float = 4.0, kv_spill: float = 0.98,
                 max_sessions: int = 200_000, capacity_blocks: int = 100_000,
                 min_agent_load: float = 1e-3, warmup_per_replica: float = 8.0,
                 new_ratio: float = 2.0, new_abs: float = 4.0,
                 tokens_per_request: float = TOKENS_PER_REQUEST) -> None:
        if anchor_blocks < 1 or half_life_s <= 0 or spread <= 0:
            raise ValueError("anchor_blocks >= 1, half_life_s > 0 and spread > 0 required")
        if tokens_per_request < 0:
            raise ValueError("tokens_per_request must be >= 0")
        self.tokens_per_request = tokens_per_request
        self.anchor_blocks = anchor_blocks
        self.half_life_s = half_life_s
        self.spread = spread
        self.spill_ratio = spill_ratio
        self.spill_abs = spill_abs
        self.kv_spill = kv_spill
        self.max_sessions = max_sessions
        self.min_agent_load = min_agent_load
        self.warmup_per_replica = warmup_per_replica
        self.new_ratio = new_ratio
        self.new_abs = new_abs
        self._capacity = capacity_blocks
        self._load: dict[Hashable, _Decayed] = {}
        self._total = _Decayed()
        self.placement: dict[Hashable, list[int]] = {}
        self.sessions: OrderedDict[Hashable, int] = OrderedDict()
        self.index = PrefixIndex(capacity_blocks)
        self.spills = 0
        #: decisions by path: thread (stayed home), member, spill
        self.decisions: dict[str, int] = defaultdict(int)

    # -- load bookkeeping -------------------------------------------------------------
    def _record(self, a: Hashable, now: float) -> float:
        d = self._load.get(a)
        if d is None:
            d = self._load[a] = _Decayed()
            d.t = now
        d.at(now, self.half_life_s)
        d.value += 1.0
        self._total.at(now, self.half_life_s)
        self._total.value += 1.0
        return d.value

    def _target(self, a_load: float, now: float, n: int) -> int:
        total = max(self._total.at(now, self.half_life_s), 1e-12)
        if total < self.warmup_per_replica * n:
            return 1
        return max(1, min(n, math.ceil(self.spread * n * a_load / total - 1e-9)))

    def _commitment(self, now: float) -> dict[int, float]:
        c: dict[int, float] = defaultdict(float)
        stale = []
        for a, members in self.placement.items():
            la = self._load[a].at(now, self.half_life_s)
            if la < self.min_agent_load:
                stale.append(a)
                continue
            if members:
                share = la / len(members)
                for r in members:
                    c[r] += share
        for a in stale:
            del self.placement[a]
            del self._load[a]
        return c

    # -- decision ---------------------------------------------------------------------
    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        at = {replicas[p].index: p for p in pos}
        for r in replicas:
            self.index.set_capacity(r.index, r.capacity_blocks or self._capacity)
        tpr = self.tokens_per_request
        load = {p: load_score(replicas[p], 1.0, tpr) for p in pos}
        mean = sum(load.values()) / len(pos)

        def over(p: int) -> bool:
            return (overloaded(load[p], mean, self.spill_ratio, self.spill_abs)
                    or replicas[p].kv_usage >= self.kv_spill)

        now = ctx.now_s
        a = agent_id(ctx, self.anchor_blocks)
        a_load = self._record(a, now)
        # the history a request extends is its thread: its session's prompts for its agent
        skey = (ctx.tenant, ctx.session_id, a) if ctx.session_id is not None else None

        keys = ctx.keys
        tpk = ctx.input_length / len(keys) if keys and tpr > 0 else 0.0
        lightest = min(load.values())
        if skey is not None:
            r = self.sessions.get(skey)
            p = at.get(r) if r is not None else None
            # moving re-prefills the history elsewhere: worth it only when home's extra
            # queue exceeds that work
            if p is not None and (not over(p) or load[p] - lightest
                                  <= self.index.match_len(r, keys) * tpk / (tpr or 1.0)):
                self.sessions.move_to_end(skey)
                self.decisions["thread"] += 1
                return p

        members = [r for r in self.placement.get(a, ()) if r in at]
        target = self._target(a_load, now, len(pos))
        if len(members) < target:
            self._grow(a, ctx, members, target, replicas, pos, at, now, load)
        elif len(members) > target + 1:
            del members[target + 1:]
        self.placement[a] = members

        ok = [at[r] for r in members if not over(at[r])]
        if ok and self.new_ratio > 0 and (skey is None or skey not in self.sessions):
            # a new session carries no history: a much lighter replica outweighs the anchor
            # ... unless the anchor it would recompute elsewhere outweighs the difference
            best = min(ok, key=load.__getitem__)
            anchor_work = self.index.match_len(replicas[best].index, keys) * tpk / (tpr or 1.0)
            if load[best] > self.new_ratio * lightest + self.new_abs + anchor_work:
                ok = []
        if ok:
            choice = min(ok, key=lambda p: (-self.index.match_len(replicas[p].index, keys),
                                            load[p]))
            self.decisions["member"] += 1
        else:
            outside = [p for p in pos if replicas[p].index not in members]
            choice = min(outside or pos, key=load.__getitem__)
            if outside:
                members.append(replicas[choice].index)
                self.spills += 1
            self.decisions["spill"] += 1
        if skey is not None:
            self.sessions[skey] = replicas[choice].index
            self.sessions.move_to_end(skey)
            if len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return choice

    def _grow(self, a: Hashable, ctx: RequestContext, members: list[int], target: int,
              replicas: Sequence[ReplicaView], pos: list[int], at: dict[int, int],
              now: float, load: dict[int, float]) -> None:
        label = agent_label(a)
        anchor = list(ctx.keys[: self.anchor_blocks])
        commit = self._commitment(now)
        prefix_labels: set[str] | None = None

        def reports_anchor(r: ReplicaView) -> bool:
            # A replica's policy may fingerprint anchors differently (e.g. a learned anchor
            # length): any "fp:" label naming a key of this request's prefix is a shared
            # anchor, since a chained key stands for its whole prefix.
            nonlocal prefix_labels
            labels = r.extra.get("anchors", ())
            if not labels:
                return False
            if label in labels:
                return True
            if prefix_labels is None:
                prefix_labels = {agent_label(("fp", k)) for k in ctx.keys[:512]}
            return not prefix_labels.isdisjoint(labels)
        while len(members) < target:
            cands = [p for p in pos if replicas[p].index not in members]
            if not cands:
                return

            def rank(p: int) -> tuple:
                r = replicas[p]
                holds = (reports_anchor(r)
                         or (anchor and self.index.match_len(r.index, anchor) == len(anchor)))
                return (not holds, round(commit.get(r.index, 0.0), 6), load[p])
            best = min(cands, key=rank)
            members.append(replicas[best].index)

    # -- notifications ----------------------------------------------------------------
    def on_start(self, ctx: RequestContext, replica: int) -> None:
        self.index.insert(replica, ctx.keys)

    def on_replica_removed(self, replica: int) -> None:
        self.index.clear(replica)
        for members in self.placement.values():
            if replica in members:
                members.remove(replica)

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        return self.index.match_len(replica, ctx.keys)


ROUTERS = {"agent": lambda **params: AgentRouter(**params)}
