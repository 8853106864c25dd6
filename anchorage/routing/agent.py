"""``agent``: prefix routing priced in seconds, with what agents tell it added, and a guard
that falls back to prefix routing where its own choices are measured to lose.

Spec, per request ``q`` (``L`` prompt tokens, keys ``k_1..k_n``, ``t = L / n`` tokens per
block) over the healthy replicas ``H``:

1. **Match** ``m_r`` (blocks of ``q``'s prefix cached on ``r``): the router's prefix model
   of ``r`` (``PrefixIndex``: the prompts it sent there, LRU-bounded by ``r``'s KV
   capacity), or, once ``r`` has published KV events (``on_kv_event``), the index those
   events keep (what ``r`` really holds). Agent knowledge raises it, never lowers it:

   - *thread history on a host tier*: the thread's home ``h`` keeps a host tier
     (``ReplicaView.host_tier``): its previous prompt outlives a GPU eviction there, so
     ``m_h >= min(prev, n)``;
   - *anchors a replica reports* (``ReplicaView.extra["anchors"]``, labels from
     ``agent_label``): a replica whose eviction policy protects or prefetches the request's
     anchor holds it: ``m_r >= j`` for the deepest key ``k_j`` whose ``fp:`` label it reports
     (``j = a`` for the client's agent hint, ``a`` the learned anchor length below).

2. **Cost** of sending ``q`` to ``r``, in seconds (``c_r = 1 / prefill_tokens_per_s`` from the
   replica's cost model; unknown rates priced as the known ones' median, or as 1 s per
   token when none is known, since then only ratios between replicas matter):

       cost_r = c_r x (queued_r + request_tokens x (running_r + waiting_r)
                       + (1 + locality) x u_r),       u_r = max(0, L - m_r x t)

   ``queued_r`` is the prefill queued on ``r`` (tokens, ``ReplicaView.queued_tokens``), so
   ``c_r (queued_r + u_r)`` is the TTFT ``q`` waits there; each co-scheduled request adds
   ``request_tokens`` of step time. ``locality x u_r`` prices what the uncached suffix costs
   *later*: it is written into ``r``'s full cache and evicts as many blocks of other
   prompts, to be recomputed when they return (``locality = 0``: the least TTFT now).

3. **Choice**: ``argmin cost_r``; ties go to the thread's home, then to the replica
   prefix routing picks (below), then to the lower KV usage and position.

4. **Prefix floor.** ``p*`` = SGLang's cache-aware choice on the same model and loads
   (``anchorage.routing.prefix.cache_aware_pick``). The choice of step 3 deviates from
   ``p*`` only where its predicted cost is strictly lower, and in two ways it is never
   worse by construction: a request whose whole prefix is cached on an idle replica goes
   there (cost 0, the least possible), and a match only ever lowers a cost.

5. **Guard.** Two shadow worlds follow a sample of the sessions (a ``guard_sample`` share,
   chosen by a hash of tenant and session id: spatial sampling, as SHARDS samples a
   cache's keys, so each shadow replica's capacity is scaled by the same share): one
   routed by step 3, one by ``p*``, each a ``PrefixIndex`` of its own (same loads). Each
   predicts the tokens its rule would find cached; ``gain`` = exponentially weighted sums (window
   ``guard_window`` requests) of own minus prefix. While the prefix world's sum exceeds
   the own world's by more than ``guard_margin`` of it, the router sends requests to
   ``p*`` (``decisions["guard"]``); it returns to step 3 when the own world is level again.
   The guard judges only after ``guard_window / 2`` requests, and never overrides the
   floor (a replica holding the whole prompt that costs less than ``p*``).
   ``guard = False`` turns the shadows off.

6. **Threads and agents.** A thread is ``(tenant, session, agent)``: an agent's prompts in
   one session extend one another; its home is where its last prompt went. The agent is
   the client's hint scoped by tenant, else the *learned* anchor: the longest leading run
   of the prompt's keys that two sessions have used (``anchorage.fingerprint``): a
   framework preamble shared by every agent is not an agent, the instructions after it
   are. ``decisions`` counts ``home`` (the thread stayed), ``moved`` (it left home),
   ``new`` (no home) and ``guard``.

State is bounded: threads in a ``BoundedLRU`` (entries and bytes), the learned-anchor
table LRU-capped at ``max_anchor_keys`` keys, each index bounded by the replicas'
capacities. ``on_peer_start`` (another router process's decision) updates the model,
shadows, anchors and the thread's home as if this router had decided it.

Parameters: ``locality`` (1.0), ``request_tokens`` (64), ``tokens_per_request`` (2048,
the load unit of the prefix rule: ``anchorage.routing.load``), ``cache_threshold`` (0.3),
``balance_abs_threshold`` (64), ``balance_rel_threshold`` (1.5): SGLang's defaults for
``p*``; ``guard`` (True), ``guard_window`` (2000 sampled requests), ``guard_margin`` (0.02),
``guard_sample`` (0.125);
``max_sessions`` (200_000 threads), ``max_table_bytes`` (64 MiB), ``max_anchor_keys``
(262_144), ``capacity_blocks`` (100_000: the model's bound for a replica whose view has
none). ``locality`` and ``request_tokens`` were chosen on the tuning set of
``anchorage.routing.protocol``; measurements in ``docs/research/routing.md``.
"""

from __future__ import annotations

import zlib
from operator import attrgetter
from statistics import median
from typing import Hashable, Sequence

from anchorage.fingerprint import PrefixOwnership
from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.bounded import BoundedLRU
from anchorage.routing.load import TOKENS_PER_REQUEST, load_scores
from anchorage.routing.prefix import cache_aware_pick
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


_INDEX_CAPACITY = attrgetter("index", "capacity_blocks")
_RATE = attrgetter("prefill_tokens_per_s")


class AgentRouter(Router):
    name = "agent"

    def __init__(self, locality: float = 1.0, request_tokens: float = 64.0,
                 tokens_per_request: float = TOKENS_PER_REQUEST, cache_threshold: float = 0.3,
                 balance_abs_threshold: float = 64, balance_rel_threshold: float = 1.5,
                 guard: bool = True, guard_window: int = 2000, guard_margin: float = 0.02,
                 guard_sample: float = 0.125,
                 max_sessions: int = 200_000, max_table_bytes: int = 64 << 20,
                 max_anchor_keys: int = 1 << 18, capacity_blocks: int = 100_000) -> None:
        if locality < 0 or request_tokens < 0 or tokens_per_request < 0:
            raise ValueError("locality, request_tokens and tokens_per_request must be >= 0")
        if guard_window < 1 or guard_margin < 0 or not 0 < guard_sample <= 1:
            raise ValueError("guard_window must be >= 1, guard_margin >= 0 and "
                             "0 < guard_sample <= 1")
        if max_sessions < 1 or max_table_bytes < 1 or max_anchor_keys < 1:
            raise ValueError("max_sessions, max_table_bytes and max_anchor_keys must be >= 1")
        self.locality = locality
        self.request_tokens = request_tokens
        self.tokens_per_request = tokens_per_request
        self.prefix_params = (cache_threshold, balance_abs_threshold, balance_rel_threshold)
        self.guard = guard
        self._decay = 1.0 - 1.0 / guard_window
        self.guard_window = guard_window
        self.guard_sample = guard_sample
        self._reports = False
        self._seen = 0                                  # requests the shadows followed
        self.guard_margin = guard_margin
        self._capacity = capacity_blocks
        self.index = PrefixIndex(capacity_blocks)       # the router's model of each replica
        self.precise = PrefixIndex(None)                # kept by the replicas' KV events
        self._evented: set[int] = set()
        self.shadow_own = PrefixIndex(capacity_blocks)
        self.shadow_prefix = PrefixIndex(capacity_blocks)
        self.gain_own = 0.0                             # shadow worlds' cached tokens (EWMA)
        self.gain_prefix = 0.0
        self.fallback = False                           # the guard sends requests to p*
        self.owners = PrefixOwnership(max_anchor_keys)
        # thread -> (replica, blocks of its previous prompt)
        self.sessions = BoundedLRU(max_sessions, max_table_bytes)
        self._caps: list = []
        self.decisions: dict[str, int] = {"home": 0, "moved": 0, "new": 0, "guard": 0}

    # -- identity ------------------------------------------------------------------------
    def anchor_length(self, keys: Sequence[Hashable]) -> int:
        """The leading keys two sessions have used."""
        return self.owners.shared_prefix_len(keys)

    def agent_of(self, ctx: RequestContext) -> Hashable:
        if ctx.agent_hint:
            return ("hint", ctx.tenant, ctx.agent_hint)
        keys = ctx.keys
        if not keys:
            return ("empty", ctx.tenant)
        a = self.anchor_length(keys)
        return ("fp", keys[a - 1] if a else keys[0])

    def _thread(self, ctx: RequestContext, a: Hashable) -> Hashable | None:
        return (ctx.tenant, ctx.session_id, a) if ctx.session_id is not None else None

    # -- the decision ----------------------------------------------------------------------
    def _sync(self, replicas: Sequence[ReplicaView]) -> None:
        caps = list(map(_INDEX_CAPACITY, replicas))
        if caps != self._caps:
            self._caps = caps
            for i, c in caps:
                c = c or self._capacity
                self.index.set_capacity(i, c)
                shadow = max(1, int(c * self.guard_sample))
                self.shadow_own.set_capacity(i, shadow)
                self.shadow_prefix.set_capacity(i, shadow)

    def _matches(self, index: PrefixIndex, ctx: RequestContext, replicas, pos,
                 home, a: Hashable, alen: int, got: dict | None = None) -> dict[int, int]:
        """``m_r`` (step 1), by position, for the positions with a match (others: 0).
        ``got``: ``index.match(keys)`` when the caller has it."""
        keys = ctx.keys
        out: dict[int, int] = {}
        if not keys:
            return out
        if index is self.index and self._evented:
            for p in pos:
                i = replicas[p].index
                m = (self.precise if i in self._evented else index).match_len(i, keys)
                if m:
                    out[p] = m
        else:
            if got is None:
                got = index.match(keys)
            if got:
                at = {replicas[p].index: p for p in pos}
                for i, m in got.items():
                    p = at.get(i)
                    if p is not None and m:
                        out[p] = m
        if home is not None:
            for p in pos:
                if replicas[p].index == home[0] and replicas[p].host_tier:
                    out[p] = max(out.get(p, 0), min(home[1], len(keys)))
        if self._reports:
            self._reported(ctx, replicas, pos, a, alen, out)
        return out

    def _reported(self, ctx, replicas, pos, a, alen, out) -> None:
        keys = ctx.keys
        depth = {agent_label(("fp", k)): j + 1 for j, k in enumerate(keys[:512])}
        if a[0] == "hint":
            depth[agent_label(a)] = max(alen, 1)
        for p in pos:
            labels = replicas[p].extra.get("anchors") or ()
            best = max((depth.get(lab, 0) for lab in labels), default=0)
            if best > out.get(p, 0):
                out[p] = min(best, len(keys))

    def _base(self, replicas, pos) -> tuple[list[float], list[float] | None]:
        """Per position: the queue cost ``c_r (queued + request_tokens x requests)`` and
        ``c_r`` (step 2; None: every rate unknown, costs in tokens). Also notes whether
        any replica reports anchors."""
        rt = self.request_tokens
        self._reports = any([v.extra.get("anchors") for v in replicas if v.extra])
        queue = [v.queued_tokens + rt * (v.running + v.waiting) for v in replicas]
        rates = list(map(_RATE, replicas))
        if not any(rates):
            return queue, None
        known = [x for x in rates if x > 0]
        if len(known) < len(rates):
            fill = median(known)
            rates = [x if x > 0 else fill for x in rates]
        inv = [1.0 / x for x in rates]
        return [q * c for q, c in zip(queue, inv)], inv

    def _choose(self, ctx, replicas, pos, m, base, inv, home, prefix_p) -> tuple[int, float]:
        """Step 3: the least cost (ties: home, ``p*``, KV usage, position); its cost."""
        L = ctx.input_length
        tpk = L / len(ctx.keys) if ctx.keys else 0.0
        w = 1.0 + self.locality
        if inv is None:
            cost = [base[p] + w * L for p in pos]
            for j, p in enumerate(pos):
                mp = m.get(p)
                if mp:
                    cost[j] -= w * min(L, mp * tpk)
        else:
            cost = [base[p] + w * L * inv[p] for p in pos]
            for j, p in enumerate(pos):
                mp = m.get(p)
                if mp:
                    cost[j] -= w * min(L, mp * tpk) * inv[p]
        lo = min(cost)
        if cost.count(lo) == 1:
            return pos[cost.index(lo)], lo
        h = home[0] if home is not None else None
        tied = [p for p, c in zip(pos, cost) if c == lo]
        return min(tied, key=lambda p: (replicas[p].index != h, p != prefix_p,
                                        replicas[p].kv_usage, p)), lo

    def _cost_at(self, ctx, p, m, base, inv) -> float:
        tpk = ctx.input_length / len(ctx.keys) if ctx.keys else 0.0
        u = ctx.input_length - m.get(p, 0) * tpk
        c = 1.0 if inv is None else inv[p]
        return base[p] + (1.0 + self.locality) * (u if u > 0 else 0.0) * c

    def _prefix_choice(self, ctx, replicas, pos, index, score, got=None) -> int:
        return cache_aware_pick(ctx.keys, replicas, pos, score, index, self._capacity,
                                *self.prefix_params, matches=got)

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        self._sync(replicas)
        loads = load_scores(replicas, 1.0, self.tokens_per_request)
        score = dict(zip(pos, map(loads.__getitem__, pos)))
        a = self.agent_of(ctx)
        alen = self.anchor_length(ctx.keys) if ctx.agent_hint else 0
        skey = self._thread(ctx, a)
        home = self.sessions.get(skey) if skey is not None else None
        if home is not None and not any(replicas[p].index == home[0] for p in pos):
            home = None
        base, inv = self._base(replicas, pos)     # (and whether anchors are reported)
        got = self.index.match(ctx.keys) if ctx.keys else {}
        p_star = self._prefix_choice(ctx, replicas, pos, self.index, score, got)
        m = self._matches(self.index, ctx, replicas, pos, home, a, alen, got)
        own, own_cost = self._choose(ctx, replicas, pos, m, base, inv, home, p_star)
        if self.guard and self._sampled(ctx):
            self._shadow_step(ctx, replicas, pos, score, home, a, alen, base, inv)
        # the floor holds under the guard too: a replica holding the whole prompt that
        # costs less than p* (its KV events may show what the model does not) is taken
        guarded = self.guard and self.fallback and not (
            m.get(own, 0) >= len(ctx.keys) - 1 and own_cost < self._cost_at(ctx, p_star, m, base, inv))
        choice = p_star if guarded else own
        if guarded:
            self.decisions["guard"] += 1
        elif home is None:
            self.decisions["new"] += 1
        elif replicas[choice].index == home[0]:
            self.decisions["home"] += 1
        else:
            self.decisions["moved"] += 1
        if skey is not None:
            self.sessions[skey] = (replicas[choice].index, len(ctx.keys))
        return choice

    def _sampled(self, ctx: RequestContext) -> bool:
        """The shadows follow a sample of the sessions (spatial sampling, as SHARDS samples
        a cache's keys: capacities scaled by the rate)."""
        if self.guard_sample >= 1.0:
            return True
        sid = ctx.session_id if ctx.session_id is not None else ctx.request_id
        h = zlib.crc32(f"{ctx.tenant}\x00{sid}".encode())
        return h < self.guard_sample * 4294967296.0

    def _shadow_step(self, ctx, replicas, pos, score, home, a, alen, base, inv) -> None:
        """Step 5: route ``ctx`` in both shadow worlds and compare what each finds."""
        keys = ctx.keys
        tpk = ctx.input_length / len(keys) if keys else 0.0
        sp = self._prefix_choice(ctx, replicas, pos, self.shadow_prefix, score)
        ms = self._matches(self.shadow_own, ctx, replicas, pos, home, a, alen)
        so, _ = self._choose(ctx, replicas, pos, ms, base, inv, home, sp)
        d = self._decay
        self.gain_own = d * self.gain_own + tpk * ms.get(so, 0)
        self.gain_prefix = d * self.gain_prefix + tpk * self.shadow_prefix.match_len(
            replicas[sp].index, keys)
        self.shadow_own.insert(replicas[so].index, keys)
        self.shadow_prefix.insert(replicas[sp].index, keys)
        self._seen += 1
        if self._seen < self.guard_window // 2:
            self.fallback = False                       # not enough evidence yet
        elif self.fallback:
            self.fallback = self.gain_own < self.gain_prefix
        else:
            self.fallback = self.gain_prefix > self.gain_own * (1.0 + self.guard_margin)

    # -- notifications ---------------------------------------------------------------------
    def _observe(self, ctx: RequestContext) -> None:
        sid = ctx.session_id if ctx.session_id is not None else ("request", ctx.request_id)
        self.owners.observe(ctx.keys, (ctx.tenant, sid))

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        self.index.insert(replica, ctx.keys)
        self._observe(ctx)

    def on_peer_start(self, ctx: RequestContext, replica: int) -> None:
        """Another router sent ``ctx`` to ``replica``: follow its decision."""
        skey = self._thread(ctx, self.agent_of(ctx))
        if skey is not None:
            self.sessions[skey] = (replica, len(ctx.keys))
        self.index.insert(replica, ctx.keys)
        if self.guard and self._sampled(ctx):
            self.shadow_own.insert(replica, ctx.keys)
            self.shadow_prefix.insert(replica, ctx.keys)
        self._observe(ctx)

    def on_kv_event(self, replica: int, event) -> None:
        self.precise.apply_event(replica, event)
        self._evented.add(replica)

    def on_replica_removed(self, replica: int) -> None:
        for idx in (self.index, self.precise, self.shadow_own, self.shadow_prefix):
            idx.clear(replica)
        self._evented.discard(replica)
        self._caps = []

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        src = self.precise if replica in self._evented else self.index
        return src.match_len(replica, ctx.keys)


ROUTERS = {"agent": lambda **params: AgentRouter(**params)}
