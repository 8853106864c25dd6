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
  history elsewhere, so a long thread waits out a burst that a short one escapes. When
  ``h`` keeps a host tier (``ReplicaView.host_tier``) the history outlives its GPU
  eviction there: ``m_h`` is at least the thread's previous prompt (in blocks), and a
  full GPU cache (``kv_usage >= kv_spill``) alone does not make ``h`` overloaded for it
  (the queue rule still does): a full cache is the steady state of a tiered replica at
  load, and leaving it re-prefills the whole history on a replica as full;
  (2) otherwise, to the member ``r`` of ``P_a`` that is not
  overloaded with the least ``load_r - w(m_r)`` (``m_r``: the request's prefix match in
  the router's model on ``r``; the thread's history when it moved), then least load: a
  prefix saves its prefill where it is, and members that hold the same anchor are
  decided by load (with ``tokens_per_request = 0``: the longest match, then least
  load); a *new* thread (no history to lose) weighs its anchor
  as a known thread weighs its history: it treats members as overloaded when the
  lightest member's load exceeds ``new_ratio * min(load) + new_abs + w(anchor blocks
  matched there)`` over all replicas (defaults 1 and 0: the member's extra queue exceeds
  the prefill its anchor saves); (3) if every member is overloaded, spill: add the
  least loaded non-member to ``P_a`` (re-place the anchor there) and route there; if
  ``P_a = H``, the least loaded replica. The thread is (re)bound to the choice.
  ``decisions`` counts the paths taken (``thread``, ``member``, ``spill``).

State is bounded and every decision costs O(n log keys), whatever the number of agents
seen: agent loads decay with one half-life, so they are kept in a common scale
(``s_a = L_a(t) * 2^((t - e) / half_life_s)`` for an epoch ``e`` rebased every 64
half-lives) and the committed load ``C_r`` is kept incrementally (each change of ``L_a``
or ``P_a`` updates the members' sums). Agents and threads live in LRU tables bounded in
entries and bytes (``anchorage.routing.bounded``); an agent whose load decayed below
``min_agent_load`` is forgotten (its placement too) when it is next seen or when it is
the least recently seen. ``on_peer_start(ctx, r)`` applies another router's decision
(shared state between router processes): the agent's load, the thread's binding, the
placement and the prefix model follow it as if this router had decided it.

Parameters: ``anchor_blocks`` (4), ``half_life_s`` (60), ``spread`` (1.0),
``warmup_per_replica`` (8), ``new_ratio`` (1; 0 disables), ``new_abs`` (0),
``spill_ratio`` (1.5), ``spill_abs`` (4), ``kv_spill`` (0.98), ``max_sessions``
(threads remembered, 200_000, LRU), ``max_agents`` (agents remembered, 200_000, LRU),
``max_table_bytes`` (64 MiB per table), ``capacity_blocks`` (prefix model per replica when the
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

The new-thread defaults (``new_ratio`` 1, ``new_abs`` 0; were 2 and 4, which kept a new
thread on a member up to twice the lightest load + 4 requests whatever its anchor was
worth) were measured in the fleet benchmark (``bench/bench_fleet.py``, goodput within
the SLO, seeds drawn apart from those of the table too): SWE-agent +2.8 % (5 seeds; its
agents' anchors save ~0.3 requests of prefill against load gaps of ~80 between its 2
replicas), the generated topologies +2.8 % (3 seeds, held out), Mooncake +33 % (no
session ids: every request is a new thread), WEKA level (its sessions share no block:
every session is its own agent). Diverting whenever the member's load exceeds the anchor
work (``new_ratio`` ~0) measured better on SWE but 10-19 % worse on the generated
topologies. At 4,000 blocks per replica (``bench/bench_router_sim.py``, random topology)
the rule costs 3.0 / 4.5 points of hit rate (4 / 8 replicas; anchors copied to more
replicas), still +3.4 / +3.9 over ``prefix``. ``docs/research/fleet.md``, "Where new
threads go".

Members weighed by load less the prefill their match saves (2026-12-05; was the longest
match first, then load). Measured against the old rule in the fleet benchmark:
- SWE-agent: +1.1 % on the table's seeds 1-3, and +3.8 % on seeds 4-6, which nothing was
  chosen on. The two members both hold the shared system prompt, and a block or two more
  in the router's model had decided where new sessions went, whatever the load.
- The generated topologies +0.2 %, WEKA -0.2 %, Mooncake -0.1 %.
- At 4,000 blocks (``bench/bench_router_sim.py``, random topology, 4 / 8 replicas):
  -0.6 / -0.3 points of hit rate, and TTFT p90 0.43x / 0.34x round_robin's (was 0.46x /
  0.35x).
``docs/research/fleet.md``, "Members weighed by load".
"""

from __future__ import annotations

import math
from collections import defaultdict
from operator import attrgetter
from typing import Hashable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.keys import agent_id
from anchorage.routing.load import TOKENS_PER_REQUEST, load_scores, overloaded
from anchorage.routing.prefix_index import PrefixIndex

_REBASE_HALF_LIVES = 64.0


def agent_label(a: Hashable) -> str:
    """The string a replica uses for agent ``a`` in ``extra["anchors"]``."""
    kind = a[0]
    if kind == "hint":
        return f"{a[1]}/{a[2]}" if a[1] is not None else str(a[2])
    if kind == "fp":
        k = a[1]
        return f"fp:{k:016x}" if isinstance(k, int) and k >= 0 else f"fp:{k}"
    return "empty"


#: one agent's state in the table: ``(scaled load, members)``, a float and a tuple of
#: replica ids. Plain tuples of scalars, not objects: CPython's cycle collector untracks
#: such tuples, so the agent and thread tables (100k+ entries) hold nothing it has to
#: walk, and a decision never pays for a collection over them.
_NEW = (0.0, ())
_INDEX_CAPACITY = attrgetter("index", "capacity_blocks")
_EXTRA = attrgetter("extra")


class AgentRouter(Router):
    name = "agent"

    def __init__(self, anchor_blocks: int = 4, half_life_s: float = 60.0, spread: float = 1.0,
                 spill_ratio: float = 1.5, spill_abs: float = 4.0, kv_spill: float = 0.98,
                 max_sessions: int = 200_000, capacity_blocks: int = 100_000,
                 min_agent_load: float = 1e-3, warmup_per_replica: float = 8.0,
                 new_ratio: float = 1.0, new_abs: float = 0.0,
                 tokens_per_request: float = TOKENS_PER_REQUEST, max_agents: int = 200_000,
                 max_table_bytes: int = 64 << 20) -> None:
        if anchor_blocks < 1 or half_life_s <= 0 or spread <= 0:
            raise ValueError("anchor_blocks >= 1, half_life_s > 0 and spread > 0 required")
        if tokens_per_request < 0:
            raise ValueError("tokens_per_request must be >= 0")
        if max_sessions < 1 or max_agents < 1 or max_table_bytes < 1:
            raise ValueError("max_sessions, max_agents and max_table_bytes must be >= 1")
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
        self._epoch: float | None = None
        self._now = 0.0
        self._total = 0.0                               # sum of all records, scaled
        self._commit: dict[int, float] = defaultdict(float)   # C_r, scaled
        self.agents = BoundedLRU(max_agents, max_table_bytes,       # agent -> (scaled, members)
                                 on_evict=lambda a, st: self._drop(st))
        # thread -> (replica, blocks of its previous prompt)
        self.sessions = BoundedLRU(max_sessions, max_table_bytes)
        self.index = PrefixIndex(capacity_blocks)
        self._caps: list = []
        self.spills = 0
        #: decisions by path: thread (stayed home), member, spill
        self.decisions: dict[str, int] = defaultdict(int)

    @property
    def placement(self) -> dict[Hashable, list[int]]:
        """Agent -> replicas holding its anchor (read-only view)."""
        return {a: list(m) for a, (_, m) in self.agents.items() if m}

    # -- load bookkeeping (scaled: every load decays by the same factor) -------------
    def _scale(self, now: float) -> float:
        """2^((now - epoch) / half_life); rebases the epoch when it grows large. A ``now``
        before the epoch (a context stamped on another clock) counts as the epoch: loads
        never grow backwards in time, and 2^x cannot underflow to 0 (a division by zero
        once the clocks were more than ~1,074 half-lives apart)."""
        if self._epoch is None:
            self._epoch = now
        x = max(0.0, (now - self._epoch) / self.half_life_s)
        if x > _REBASE_HALF_LIVES:
            f = 2.0 ** -x
            put = self.agents.replace
            for a, (scaled, m) in list(self.agents.items()):
                put(a, (scaled * f, m))
            for r in self._commit:
                self._commit[r] *= f
            self._total *= f
            self._epoch = now
            x = 0.0
        return 2.0 ** x

    def _commit_add(self, scaled: float, members: Sequence[int], sign: float) -> None:
        if members:
            share = sign * scaled / len(members)
            commit = self._commit
            for r in members:
                commit[r] += share

    def _set_members(self, a: Hashable, members: Sequence[int]) -> None:
        st = self.agents.get(a)
        if st is None:
            return
        scaled, old = st
        self._commit_add(scaled, old, -1.0)
        members = tuple(members)
        self._commit_add(scaled, members, 1.0)
        self.agents.replace(a, (scaled, members))

    def _drop(self, st: tuple) -> None:
        self._commit_add(st[0], st[1], -1.0)   # its records stay in the fleet's total

    def _forget(self, a: Hashable) -> None:
        st = self.agents.pop(a)
        if st is not None:
            self._drop(st)

    def _sweep(self, now: float, budget: int = 2) -> None:
        """Forget up to ``budget`` least recently seen agents whose load decayed away."""
        scale = self._scale(now)
        for _ in range(budget):
            old = self.agents.oldest()
            if old is None or old[1][0] / scale >= self.min_agent_load:
                return
            self._forget(old[0])

    def _record(self, a: Hashable, now: float) -> tuple[tuple, float]:
        """Count one request of ``a``: its (scaled load, members) and its load."""
        scale = self._scale(now)
        st = self.agents.get(a)
        if st is not None and st[0] / scale < self.min_agent_load:
            self._forget(a)             # decayed away: placed afresh
            st = None
        scaled, members = st if st is not None else _NEW
        self._commit_add(scale, members, 1.0)
        st = (scaled + scale, members)
        if a in self.agents:
            self.agents.touch(a)
            self.agents.replace(a, st)
        else:
            self.agents[a] = st
        self._total += scale
        return st, st[0] / scale

    def _target(self, a_load: float, now: float, n: int) -> int:
        total = max(self._total / self._scale(now), 1e-12)
        if total < self.warmup_per_replica * n:
            return 1
        return max(1, min(n, math.ceil(self.spread * n * a_load / total - 1e-9)))

    def _bind(self, skey: Hashable, replica: int, blocks: int) -> None:
        self.sessions[skey] = (replica, blocks)

    # -- decision ---------------------------------------------------------------------
    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        at = {replicas[p].index: p for p in pos}
        caps = list(map(_INDEX_CAPACITY, replicas))
        if caps != self._caps:
            self._caps = caps
            for i, c in caps:
                self.index.set_capacity(i, c or self._capacity)
        tpr = self.tokens_per_request
        load = load_scores(replicas, 1.0, tpr)          # by position
        every = len(pos) == len(replicas)
        mean = (sum(load) if every else sum(load[p] for p in pos)) / len(pos)
        lightest = min(load) if every else min(load[p] for p in pos)

        def over(p: int) -> bool:
            return (overloaded(load[p], mean, self.spill_ratio, self.spill_abs)
                    or replicas[p].kv_usage >= self.kv_spill)

        now = ctx.now_s
        self._sweep(now)
        a = agent_id(ctx, self.anchor_blocks)
        st, a_load = self._record(a, now)
        # the history a request extends is its thread: its session's prompts for its agent
        skey = (ctx.tenant, ctx.session_id, a) if ctx.session_id is not None else None

        keys = ctx.keys
        tpk = ctx.input_length / len(keys) if keys and tpr > 0 else 0.0
        if skey is not None:
            home = self.sessions.get(skey)
            p = at.get(home[0]) if home is not None else None
            if p is not None:
                r, prev = home
                held = self.index.match_len(r, keys)
                view = replicas[p]
                if view.host_tier:   # the history outlives its GPU eviction there
                    held = max(held, min(prev, len(keys)))
                    busy = overloaded(load[p], mean, self.spill_ratio, self.spill_abs)
                else:
                    busy = over(p)
                # moving re-prefills the history elsewhere: worth it only when home's
                # extra queue exceeds that work
                if not busy or load[p] - lightest <= held * tpk / (tpr or 1.0):
                    self.sessions[skey] = (r, len(keys))   # and most recently used
                    self.decisions["thread"] += 1
                    return p

        members = [r for r in st[1] if r in at]
        target = self._target(a_load, now, len(pos))
        if len(members) < target:
            self._grow(ctx, members, target, replicas, pos, now, load, at)
        elif len(members) > target + 1:
            del members[target + 1:]

        ok = [at[r] for r in members if not over(at[r])]
        if ok and self.new_ratio > 0 and (skey is None or skey not in self.sessions):
            # a new session carries no history: a much lighter replica outweighs the anchor
            # ... unless the anchor it would recompute elsewhere outweighs the difference
            best = min(ok, key=load.__getitem__)
            anchor_work = self.index.match_len(replicas[best].index, keys) * tpk / (tpr or 1.0)
            if load[best] > self.new_ratio * lightest + self.new_abs + anchor_work:
                ok = []
        if ok:
            # the prefix each member holds saves its prefill there: weigh it against load
            match = self.index.match_len
            if tpr > 0:
                wk = tpk / tpr
                choice = min(ok, key=lambda p: (load[p] - match(replicas[p].index, keys) * wk,
                                                load[p]))
            else:                                   # no exchange rate: the longest match
                choice = min(ok, key=lambda p: (-match(replicas[p].index, keys), load[p]))
            self.decisions["member"] += 1
        else:
            outside = [p for p in pos if replicas[p].index not in members]
            choice = min(outside or pos, key=load.__getitem__)
            if outside:
                members.append(replicas[choice].index)
                self.spills += 1
            self.decisions["spill"] += 1
        self._set_members(a, members)
        if skey is not None:
            self._bind(skey, replicas[choice].index, len(keys))
        return choice

    def _grow(self, ctx: RequestContext, members: list[int], target: int,
              replicas: Sequence[ReplicaView], pos: list[int], now: float,
              load: Sequence[float], at: dict[int, int]) -> None:
        anchor = ctx.keys[: self.anchor_blocks]
        need = len(anchor)
        held = self.index.match(anchor) if anchor else {}
        holders = {i for i, m in held.items() if m == need} if need else set()
        if any(map(_EXTRA, replicas)):
            holders |= self._reporting(ctx, replicas, pos)
        q = 1e6 / self._scale(now)          # committed load, compared to 1e-6 of a request
        commit = self._commit.get
        taken = set(members)
        while len(members) < target:
            # (holds the anchor first, then least committed load, then least load)
            ranked = [(i not in holders, int(commit(i, 0.0) * q), load[p], i)
                      for i, p in at.items() if i not in taken]
            if not ranked:
                return
            i = min(ranked)[3]
            members.append(i)
            taken.add(i)

    def _reporting(self, ctx: RequestContext, replicas: Sequence[ReplicaView],
                   pos: list[int]) -> set[int]:
        """Replicas whose own policy reports this request's anchor (``extra["anchors"]``).
        A replica's policy may fingerprint anchors differently (e.g. a learned anchor
        length): any "fp:" label naming a key of this request's prefix is a shared
        anchor, since a chained key stands for its whole prefix."""
        label = agent_label(agent_id(ctx, self.anchor_blocks))
        prefix_labels: set[str] | None = None
        out = set()
        for p in pos:
            labels = replicas[p].extra.get("anchors", ())
            if not labels:
                continue
            if label not in labels:
                if prefix_labels is None:
                    prefix_labels = {agent_label(("fp", k)) for k in ctx.keys[:512]}
                if prefix_labels.isdisjoint(labels):
                    continue
            out.add(replicas[p].index)
        return out

    # -- notifications ----------------------------------------------------------------
    def on_start(self, ctx: RequestContext, replica: int) -> None:
        self.index.insert(replica, ctx.keys)

    def on_peer_start(self, ctx: RequestContext, replica: int) -> None:
        """Another router sent ``ctx`` to ``replica``: follow its decision."""
        a = agent_id(ctx, self.anchor_blocks)
        st, _ = self._record(a, ctx.now_s)
        if replica not in st[1]:
            self._set_members(a, st[1] + (replica,))
        if ctx.session_id is not None:
            self._bind((ctx.tenant, ctx.session_id, a), replica, len(ctx.keys))
        self.index.insert(replica, ctx.keys)

    def on_replica_removed(self, replica: int) -> None:
        self.index.clear(replica)
        for a, (_, m) in list(self.agents.items()):
            if replica in m:
                self._set_members(a, [r for r in m if r != replica])
        self._commit.pop(replica, None)

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        return self.index.match_len(replica, ctx.keys)


ROUTERS = {"agent": lambda **params: AgentRouter(**params)}
