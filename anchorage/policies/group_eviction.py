"""Group-scored eviction: an online approximation of Belady shared by `cachescout`,
`cachewise` and `hybrid` (which differ only in the signals they enable).

Specification
-------------
Every cached block belongs to one *group*:

- ``anchor(f)``: leading blocks shared across sessions, keyed by the agent fingerprint ``f``
  of the request that used them (``anchorage.fingerprint``);
- ``thread(s, f)``: a session's private blocks, keyed by session id ``s`` (inferred from
  prefix continuity when the request has none) and, with transitions on, by the agent
  ``f`` of the request (a session's conversation with one agent);
- ``output(s)``: blocks filled by generated tokens of session ``s``;
- ``stale(s, i)`` / ``dup(s, i)`` (signal ``stale``): when a request of session ``s``
  reaches its ``thread(s, f)``, the thread's free blocks the prompt did not hit are
  *skipped*: those whose key the prompt holds further on (behind an evicted block, so the
  request recomputes them: duplicates) go to a new ``dup`` group, the rest (a branch the
  conversation left, a compacted history) to a new ``stale`` group (one group per such
  event, so each stays in free order).

Within a group, free blocks leave in the order they became free, a chain's tail first
(exactly LRU order inside the group). Each group has a predicted absolute next-use time
``K`` (larger = evicted first); the victim is the front block of the group with the
largest ``K`` (ties: the block freed earliest). Groups sit in a heap with lazy invalidation
(O(log G) per victim, O(1) per touched block, O(log G) per touched group per request).

Scores (``T`` = expected time to next use from now, in policy-clock seconds):

- no informative signal -> recency: ``K = epoch + mult * age + add`` with ``age = epoch -
  t_front`` (``t_front``: when the group's front block became free; ``epoch``: the last
  re-scoring time; ``mult = 1, add = 0`` by default). Among such groups the order is
  exactly LRU, so a policy with no signal *is* LRU;
- ``output`` groups once outputs are learned dead (``dead_min_samples`` = 64 output blocks
  cached, reuse frequency ``(hits + 1) / (n + 2) < dead_max_reuse`` = 0.02), and groups of
  ended sessions: ``K = inf``;
- ``dup`` groups: ``K = inf``. ``stale`` groups: the session's ``T`` (or recency ``mult``)
  divided by ``q``, the learned probability that a skipped block is requested again:
  ``q = (r + 1) / (n + 2)`` over ``n`` skipped blocks, ``r`` counting hits on them and
  requests for their keys after eviction while the key is among the last ``capacity``
  evicted stale keys (a ghost list, as ARC's, so ``q`` does not depend on how long the
  policy kept them); ``q = 1`` until ``dead_min_samples`` skipped blocks, ``K = inf`` once
  ``q < dead_max_reuse``;
- sessions after their first request (signal ``first``), in ``"wait"`` mode only: their
  gap model is the histogram of gaps (and ends) that followed sessions' first requests,
  once ``min_samples`` are learned (many sessions never send a second request: +0.8
  points on Mooncake at half-LRU; used in ``"survival"`` mode it cost 0.7-1.3 points at
  10-20 % capacity, mixing absolute waits with recency-ordered sessions);
- ``thread(s, f)`` with gaps on: ``T = W_s(e)`` = ``GapHistogram.expected_wait``:
  ``E[tau - e | tau > e] / P(return | tau > e)`` for elapsed ``e = now - last_s``, from
  the histogram of the session's pending tool (and argument cluster) when tools are on;
  otherwise (no pending tool, or tools off), by ``global_gaps``: ``"wait"`` the same
  from the histogram of all gaps, ``"survival"`` recency with ``mult = 1 / P(return |
  e)``, ``"off"`` plain recency, ``"auto"`` (default) ``"survival"`` until
  ``wait_min_gaps`` (64) gaps are learned (on a 220-request trace, absolute waits from
  thin histograms lost to recency), then ``"wait"`` when at least 10 % of
  learned gaps followed a tool call or the cache turns over faster than
  ``turnover_gap_ratio`` (2) median session gaps (a small cache cannot keep sessions
  across a gap, so predicted times matter more than recency), else ``"survival"`` (measured: ``"wait"`` wins by
  2-11 points on the generated tool workloads, ``"survival"`` by up to 3.5 on ChatDev, 1
  on Mooncake (no tool metadata) and on WEKA, where only sub-agent launches are tools). A histogram whose gaps all fall in
  one bin (no timing) is no signal. (``no_tool_context=True`` gives "no pending tool" its
  own histogram; measured worse than the global one on generated topologies.) With
  transitions on and ``f`` not the session's current agent: ``T = (T + (steps - 1) * g) / p`` (or ``mult /= p, add = (steps - 1) g /
  p`` for recency) where ``(p, steps) = reach_k(cur_s, f)`` (floored at 0.02) and ``g`` the
  mean session step gap. ``reach_k``: the probability of calling ``f`` within ``k`` steps
  (before the session ends) and the expected steps given that; parameter ``reach_steps``
  (default 2: ``TransitionLearner.reach``; an int > 2: ``TransitionLearner.hit`` over that
  many steps; ``"turnover"``: 2 unless one cache turnover spans at least 4 step gaps, then
  ``turnover / g`` rounded down to a power of two, at most 32, since a reuse k steps ahead
  can only be kept if k steps fit in one turnover). ``"turnover"`` measured (session 4,
  ``bench_policies.py``): +0.55 points at half-LRU on debate-1 and pipeline-2, up to +0.66
  at 5-10 %, but -0.4 to -1.0 at 20 % on pipeline, selector, random and debate (with long
  turnovers k reaches 16-32 and the chain, whose ends are learned late, calls almost every
  thread certain): not the default. For the
  current agent's own thread, once tool metadata exists, ``p = p_stay + (1 - p_stay) *
  p2`` and ``steps = (p_stay + s2 (1 - p_stay) p2) / p``, where ``p_stay = (C_stay + eps)
  / (n + 2 eps)`` is the learned probability that a session calls the same agent next
  given (agent, tool pending?) (after a tool call an agent continues with its result;
  otherwise the session moves on), ``p2 = reach_k(f, f) - P(f | f)`` the probability of
  coming back after leaving and ``s2`` its expected steps (2 when ``k = 2``) (at least 8
  observations; without tools this measured worse on ChatDev and is off);
- ``anchor(f)``: shared prefixes always form their own group (scoring a block all
  sessions use by one session's timing is wrong); with anchors on, ``T = min(T_base,
  T_trans)``, ``T_base = min(ia_f, now - last_f)`` (``ia_f``: EWMA, weight 0.05, of the
  agent's inter-arrival time: an anchor many sessions reuse is worth more than a
  single-use block, and one idle for long loses protection like any LRU entry); with
  transitions on, ``T_trans = g / sum_i N_i P(f | i)`` where ``N_i`` counts active
  sessions whose current agent is ``i``.

Queued requests (``on_queued``: the engine tells the policy that a request waits for
admission): the policy learns from the request at once (its arrival ends the session's
gap) and *holds* the groups its prompt will hit, its agent's ``anchor(f)`` and its
session's ``thread(s, f)``: a held group has ``K = -inf`` (evicted after every other
group) until the request is admitted (``on_request`` with its id) or finishes. Without
the hold, a request queued behind a full cache loses its cached prefix to the
admissions ahead of it (measured in the timed simulator at 8,192 blocks per replica:
20-28 % of all prompt blocks were cached at arrival and evicted before admission).

Sessions idle longer than ``end_factor`` (default 2) times the 99th percentile of learned
gaps are ended: the gap model records an end (tau = inf) and the transition learner
``i -> END``; they no longer count in ``N_i``. A returning ended session retracts that end.

Tuning parameters (the operator's CRD ``spec.policy.parameters``, mapped by
``anchorage.autoscale.params``; validated by ``check_tuning``: a bad value is a ValueError
naming the parameter and its range, an unknown name a TypeError). The defaults leave the
order above unchanged:

- ``horizon_s`` (``horizon``, seconds in (0, inf], default inf): how far ahead a
  prediction counts. A group whose expected time to next use ``T`` (recency groups: ``mult
  * T(age) + add``) exceeds it is *far reuse*, ``K = inf``: evicted before every group
  expected within the horizon (ties: freed earliest).
- ``survival_threshold`` (``survivalThreshold``, [0, 1], default 0 = off): keep a group
  only while its survival, the probability that it is used within ``horizon_s``, is at
  least this; below it ``K = inf`` (*low survival*). Thread: ``p * P(e < tau <= e + H |
  tau > e)`` from the histogram the session is scored by (its tool's, else all gaps; 1
  until ``min_samples`` gaps are learned), ``p`` its transition reach probability (1
  without transitions); anchor: ``1 - exp(-H / T)`` (Poisson reuse at rate ``1 / T``);
  recency groups are never low-survival.
- ``recency_scale_s`` (``recencyScale``, seconds in (0, inf], default inf): the time
  constant of the recency term: a group without signal idle for ``age`` is expected back
  in ``T(age) = s * (exp(age / s) - 1)`` (about ``age`` while ``age << s``; default:
  ``T(age) = age``). Monotone, so with no signal the order is still exactly LRU; a finite
  ``s`` makes long-idle unsignalled groups go before predicted ones.
- ``r_min`` (``rMin``, [0, 1], default 0): predictability gate; transition terms (thread
  reach, ``p_stay``, the anchor's ``T_trans``) apply only while ``R`` (``TransitionLearner
  .predictability``, eq. 2, refreshed at re-scoring) is at least ``r_min``. Also the
  prefetch advisor's gate when positive (``cachescout.PrefetchAdvisor``).
- ``prefetch`` (``prefetchEnabled``, bool, default true) and ``prefetch_rate_per_s``
  (``prefetchRatePerSecond``, >= 0, default 4): read by the prefetch advisor (whether it
  advises warm-ups, and how many per second); no effect on the eviction order.

Measured (``bench/bench_policies.py`` workloads at half-LRU capacity): the defaults are the
best of the values tried; e.g. ``r_min`` 0.3 costs 2.9 points on random topology (R 0.25
there, yet transitions help), and the CRD example (0.3, 120 s, 30 s, 0.6) costs 0.6-8.3 points.

Re-scoring (CacheWise section 5.3): all groups with free blocks are re-scored (``epoch =
now``) when a request arrives and the policy clock advanced by a quarter of the cache
turnover time (time to evict ``capacity`` blocks, measured online as an EWMA) or by the
median session gap if shorter (absolute scores of waiting sessions go stale on that
scale), provided at least G victims were taken since (G = groups with free blocks);
and after 4 G victims (at least 1,024). Amortised O(log G) per victim.

Learning never reads ``agent_truth`` or ``tool_duration_ms``; warm-up requests
(``ctx.warmup``) update no statistics. State: bounded tables (sessions LRU-capped at
``max_sessions``, agents at ``max_agents``, tool histograms at ``max_tools``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence

from anchorage.fingerprint import PrefixOwnership
from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.gap_predictor import GapHistogram, GapPredictor
from anchorage.policies.transitions import END, TransitionLearner

INF = math.inf
MAX_LIVE_REQUESTS = 8192  # requests in flight whose context is kept (bounded)
ANCHOR, THREAD, OUTPUT, STALE, DUP = 0, 1, 2, 3, 4
_GROUP_IDS = itertools.count(1)


TUNING_DEFAULTS: dict[str, Any] = {
    "survival_threshold": 0.0, "horizon_s": INF, "recency_scale_s": None, "r_min": 0.0,
    "prefetch": True, "prefetch_rate_per_s": 4.0,
}


def check_tuning(**params: Any) -> dict[str, Any]:
    """Validate the operator-tuned parameters (module spec, "Tuning parameters"); returns
    them normalised (``recency_scale_s`` None -> inf). Raises ValueError naming the bad
    one; an unknown name is a TypeError."""
    unknown = sorted(set(params) - set(TUNING_DEFAULTS))
    if unknown:
        raise TypeError(f"unknown tuning parameter(s) {', '.join(unknown)}; accepted: "
                        f"{', '.join(TUNING_DEFAULTS)}")
    out = dict(TUNING_DEFAULTS, **params)

    def num(name: str, lo: float, hi: float, lo_open: bool = False) -> float:
        v = out[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise ValueError(f"{name} must be a number, got {v!r}")
        if v < lo or v > hi or (lo_open and v == lo):
            rng = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
            raise ValueError(f"{name} must be in {rng}, got {v!r}")
        return float(v)

    out["survival_threshold"] = num("survival_threshold", 0.0, 1.0)
    out["horizon_s"] = num("horizon_s", 0.0, INF, lo_open=True)
    if out["recency_scale_s"] is None:
        out["recency_scale_s"] = INF
    out["recency_scale_s"] = num("recency_scale_s", 0.0, INF, lo_open=True)
    out["r_min"] = num("r_min", 0.0, 1.0)
    out["prefetch_rate_per_s"] = num("prefetch_rate_per_s", 0.0, INF)
    if not isinstance(out["prefetch"], bool):
        raise ValueError(f"prefetch must be true or false, got {out['prefetch']!r}")
    return out


@dataclass
class Signals:
    """Which signals a policy uses. All False = LRU."""

    anchors: bool = True       # value shared prefixes by agent arrival rate
    transitions: bool = True   # per-session agent transitions (threads, anchor rates)
    gaps: bool = True          # session gap model conditioned on elapsed time
    tools: bool = True         # condition gaps on tool name / argument cluster
    dead_outputs: bool = True  # learn whether generated-token blocks are ever reused
    stale: bool = True         # a thread's blocks its next prompt skipped are stale
    first: bool = True         # sessions after one request: their own return model


class Group:
    __slots__ = ("kind", "key", "sess", "agent", "free", "n", "ver", "K", "mult", "add",
                 "orph", "hold")

    def __init__(self, kind: int, key: Hashable, sess: "Session | None",
                 agent: "Agent | None"):
        self.kind = kind
        self.key = key
        self.sess = sess
        self.agent = agent
        self.free: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self.n = 0          # blocks assigned (free or in use)
        # versions are unique across groups (heap entries never compare groups)
        self.ver = next(_GROUP_IDS) << 32
        self.K: float | None = None  # absolute predicted next use, or None: recency
        self.mult = 1.0               # recency score: K = epoch + mult * age + add
        self.add = 0.0
        self.orph: Hashable = None  # the last request that orphaned this thread's blocks
        self.hold = 0  # queued requests that will hit this group at admission


class Session:
    __slots__ = ("sid", "last_s", "last_seq", "tool", "cluster", "agent", "n", "ended",
                 "groups", "state", "inflight")

    def __init__(self, sid: Hashable):
        self.sid = sid
        self.last_s = -INF
        self.last_seq = -1
        self.state = None  # (agent, tool pending) of the last request
        self.tool = None
        self.cluster = None
        self.agent = None
        self.n = 0
        self.ended = False
        self.groups: dict[Hashable, Group] = {}
        self.inflight = 0  # requests of this session admitted and not yet done


class Agent:
    __slots__ = ("fp", "last_s", "ia", "n", "group")

    def __init__(self, fp: Hashable):
        self.fp = fp
        self.last_s = -INF
        self.ia = INF
        self.n = 0
        self.group: Group | None = None


class GroupEvictionPolicy(EvictionPolicy):
    name = "group"

    def __init__(self, *, block_size: int = 16, signals: Signals | None = None,
                 cluster_fn: Callable[[Any, Any], Hashable] | None = None,
                 min_samples: int = 16, dead_min_samples: int = 64,
                 dead_max_reuse: float = 0.02, end_factor: float = 2.0,
                 eps: float = 0.1, max_sessions: int = 4096, max_agents: int = 64,
                 max_tools: int = 64, max_prefix_keys: int = 1 << 18,
                 global_gaps: str = "auto", no_tool_context: bool = False,
                 turnover_gap_ratio: float = 2.0, wait_min_gaps: int = 64,
                 survival_threshold: float = 0.0,
                 horizon_s: float = INF, recency_scale_s: float | None = None,
                 r_min: float = 0.0, prefetch: bool = True,
                 prefetch_rate_per_s: float = 4.0, reach_steps: int | str = 2):
        tuning = check_tuning(survival_threshold=survival_threshold, horizon_s=horizon_s,
                              recency_scale_s=recency_scale_s, r_min=r_min,
                              prefetch=prefetch, prefetch_rate_per_s=prefetch_rate_per_s)
        self.survival_threshold = tuning["survival_threshold"]
        self.horizon_s = tuning["horizon_s"]
        self.recency_scale_s = tuning["recency_scale_s"]
        self.r_min = tuning["r_min"]
        self.prefetch = tuning["prefetch"]
        self.prefetch_rate_per_s = tuning["prefetch_rate_per_s"]
        # plain recency (K = epoch + mult * age + add) unless a scale or horizon is set
        self._plain = self.recency_scale_s == INF and self.horizon_s == INF
        self._R = 0.0            # predictability, refreshed at every re-scoring
        self.block_size = block_size
        if global_gaps not in ("auto", "wait", "survival", "off"):
            raise ValueError(
                f"global_gaps must be auto, wait, survival or off, got {global_gaps!r}")
        self.global_gaps = global_gaps
        if reach_steps != "turnover" and not (isinstance(reach_steps, int)
                                              and not isinstance(reach_steps, bool)
                                              and reach_steps >= 2):
            raise ValueError(f"reach_steps must be 'turnover' or an int >= 2, got {reach_steps!r}")
        self.reach_steps = reach_steps
        self.turnover_gap_ratio = turnover_gap_ratio
        self.wait_min_gaps = wait_min_gaps
        self.sig = signals or Signals()
        self.cluster_fn = cluster_fn
        self.dead_min_samples = dead_min_samples
        self.dead_max_reuse = dead_max_reuse
        self.end_factor = end_factor
        self.max_sessions = max_sessions
        self.max_agents = max_agents
        self.prefix = PrefixOwnership(max_prefix_keys)
        self.gaps = GapPredictor(min_samples=min_samples, max_keys=max_tools,
                                 no_tool_context=no_tool_context)
        self.trans = TransitionLearner(eps=eps, max_agents=max_agents)
        # P(same agent next | agent, a tool is pending): after a tool call an agent usually
        # continues with its result, otherwise the session moves on
        self.stay = TransitionLearner(eps=eps, max_agents=2 * max_agents)
        self.sessions: OrderedDict[Hashable, Session] = OrderedDict()
        self.agents: OrderedDict[Hashable, Agent] = OrderedDict()
        self.at_agent: dict[Hashable, int] = {}  # active sessions per current agent
        self.step_gap = 0.0                      # EWMA of session gaps (s)
        # eviction state
        self._bgroup: dict[int, Group] = {}
        self._out_blocks: set[int] = set()
        self._out_n = 0
        self._out_hits = 0
        self._first = GapHistogram()  # gaps after a session's first request, and ends
        self._stale_seq = 0
        # keys of evicted stale blocks (ghosts, at most ``capacity``): requesting one
        # counts as a reuse, so the learned rate does not depend on how long they stayed
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._stale_n = 0      # thread blocks orphaned (their thread moved on without them)
        self._stale_hits = 0   # orphaned blocks hit again
        self._heap: list[tuple] = []
        self._nonempty: dict[int, Group] = {}  # id(group) -> group with free blocks
        self._seq = 0
        self._epoch = 0.0
        self._now = 0.0
        self._pops_since = 0
        self._turnover_s = INF
        self._turn_t0: float | None = None
        self._turn_n = 0
        # per live request: (session, agent, anchor_len), keyed by request id, so requests
        # that overlap (vLLM, the timed simulator) never see each other's session
        self._reqs: OrderedDict[Hashable, tuple] = OrderedDict()
        # ids of requests already done: one that comes back was preempted (vLLM and the
        # simulator free a preempted request's blocks) and is not a new turn to learn from
        self._done: OrderedDict[Hashable, None] = OrderedDict()
        self._cur: tuple | None = None  # the last request seen by on_request (observers)
        # queued requests (on_queued, not yet admitted) -> the groups they hold
        self._queued: dict[Hashable, tuple[Group, ...]] = {}
        self._touched: dict[int, Group] = {}
        self._capacity = 1
        self._gap_median: float | None = None
        self._gap_median_n = 0

    def attach(self, pool) -> None:
        super().attach(pool)
        self._capacity = max(1, pool.capacity_blocks)

    # -- request notifications ------------------------------------------------------------

    def on_queued(self, ctx: RequestContext) -> None:
        """A request waits for admission: learn from it now (its arrival is the end of
        the session's gap) and hold the groups its prompt will hit (its agent's anchor
        and its session's thread with that agent) until it is admitted."""
        self.on_request(ctx)
        rid = ctx.request_id
        cur = self._cur
        if rid is None or cur is None or rid in self._queued:
            return
        sess, agent, _ = cur
        held = [self._group(sess, THREAD, agent)]
        if agent is not None:
            held.append(self._anchor_group(agent))
        touched = self._touched
        for g in held:
            g.hold += 1
            touched[id(g)] = g
        self._queued[rid] = tuple(held)
        while len(self._queued) > MAX_LIVE_REQUESTS:
            self._release(next(iter(self._queued)))

    def _release(self, rid: Hashable) -> None:
        touched = self._touched
        for g in self._queued.pop(rid):
            g.hold -= 1
            touched[id(g)] = g

    def on_request(self, ctx: RequestContext) -> None:
        rid = ctx.request_id
        if rid is not None and rid in self._queued:
            self._release(rid)  # admitted now: its hits stop being free
        now = ctx.now_s
        if now > self._now:
            self._now = now
        keys = ctx.keys
        learn = not ctx.warmup
        sid = ctx.session_id
        if sid is None:
            sid = self.prefix.infer_session(keys)
            if sid is None:
                sid = ("anon", ctx.request_id)
        limit = min(len(keys), ctx.input_length // self.block_size)
        self.prefix.observe(keys[:limit], sid)
        gh = self._ghost
        if gh and learn:
            for k in keys[:limit]:
                if k in gh:
                    del gh[k]
                    self._stale_hits += 1
        if limit and ctx.session_id is None:
            self.prefix.note_tail(keys[limit - 1], sid)
        # shared prefixes always form their own group (scored by recency when anchors are
        # off): scoring a block every session uses by one session's timing is wrong
        anchor_len = self.prefix.anchor_length(keys)
        fp = self.prefix.fingerprint(keys)
        sess = self._session(sid)
        agent = self._agent(fp) if fp is not None else None
        rid = ctx.request_id
        if rid is not None and (rid in self._reqs or rid in self._done):
            learn = False  # a re-scheduled attempt or a preempted request: learnt already
        if learn:
            self._learn(ctx, sess, agent, now)
        self._cur = (sess, agent, anchor_len)
        if rid is not None:
            if rid not in self._reqs:
                sess.inflight += 1
            self._reqs[rid] = self._cur
            self._reqs.move_to_end(rid)
            while len(self._reqs) > MAX_LIVE_REQUESTS:
                _, (old_sess, _, _) = self._reqs.popitem(last=False)
                old_sess.inflight = max(0, old_sess.inflight - 1)
        if (self._now - self._epoch > self._rescore_interval()
                and self._pops_since >= len(self._nonempty)):
            self._rescore()

    def _learn(self, ctx: RequestContext, sess: Session, agent: Agent | None,
               now: float) -> None:
        sig = self.sig
        # a gap is the time from the session's last completion to this request; none is
        # observed while an earlier request of the session still runs (or never finished)
        if sess.n and sess.inflight == 0 and sess.last_s > -INF:
            gap = max(0.0, now - sess.last_s)
            if sess.ended:
                self.gaps.retract_end(sess.tool, sess.cluster)
                if sess.n == 1:
                    self._first.remove_end()
                sess.ended = False
                if sess.agent is not None:
                    self.at_agent[sess.agent] = self.at_agent.get(sess.agent, 0) + 1
            self.gaps.observe(gap, sess.tool if sig.tools else None,
                              sess.cluster if sig.tools else None)
            if sess.n == 1:
                self._first.add(gap)
            self.step_gap = gap if not self.step_gap else 0.9 * self.step_gap + 0.1 * gap
        if agent is not None:
            if agent.n:
                ia = max(0.0, now - agent.last_s)
                agent.ia = ia if agent.ia == INF else 0.95 * agent.ia + 0.05 * ia
            agent.n += 1
            agent.last_s = now
            if sig.transitions:
                prev = sess.agent
                if prev is not None:
                    self.trans.observe(prev, agent.fp)
                    if sess.state is not None:
                        self.stay.observe(sess.state, agent.fp == prev)
                    if not sess.ended:
                        self._at_dec(prev)
                self.at_agent[agent.fp] = self.at_agent.get(agent.fp, 0) + 1
        sess.agent = agent.fp if agent is not None else None
        sess.n += 1
        sess.last_seq = ctx.seq
        sess.state = (sess.agent, ctx.tool_name is not None) if sig.tools else (sess.agent, None)
        if sig.tools:
            sess.tool = ctx.tool_name
            sess.cluster = (self.cluster_fn(ctx.tool_name, ctx.tool_args)
                            if self.cluster_fn is not None and ctx.tool_name is not None
                            else None)

    def _at_dec(self, fp: Hashable) -> None:
        c = self.at_agent.get(fp, 0) - 1
        if c > 0:
            self.at_agent[fp] = c
        else:
            self.at_agent.pop(fp, None)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        bg = self._bgroup
        touched = self._touched
        for b in were_free:
            g = bg[b]
            free = g.free
            if next(iter(free)) == b:
                touched[id(g)] = g
            del free[b]
            if g.kind == STALE:
                self._stale_hits += 1
        out = self._out_blocks
        if out:
            for b in blocks:
                if b in out:
                    out.discard(b)
                    self._out_hits += 1
        self._assign(ctx, blocks, 0)

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        ck = ctx.keys
        if start < len(ck) and keys and keys[0] == ck[start]:
            self._assign(ctx, blocks, start)
            return
        # blocks filled by generated tokens
        cur = self._req(ctx)
        sess = cur[0] if cur is not None else self._session(("anon", ctx.request_id))
        g = self._group(sess, OUTPUT, None)
        bg = self._bgroup
        for b in blocks:
            old = bg.get(b)
            if old is not None:
                old.n -= 1
            bg[b] = g
            g.n += 1
            self._out_blocks.add(b)
        self._out_n += len(blocks)

    def _req(self, ctx: RequestContext) -> tuple | None:
        rid = ctx.request_id
        return self._reqs.get(rid) if rid is not None else None

    def _assign(self, ctx: RequestContext, blocks: list[int], start: int) -> None:
        cur = self._req(ctx)
        if cur is None:
            return
        sess, agent, anchor_len = cur
        bg = self._bgroup
        thread = None
        anchor = None
        for j, b in enumerate(blocks):
            if start + j < anchor_len and agent is not None:
                if anchor is None:
                    anchor = self._anchor_group(agent)
                g = anchor
            else:
                if thread is None:
                    thread = self._group(sess, THREAD, agent)
                    if thread.orph != ctx.request_id and self.sig.stale:
                        thread.orph = ctx.request_id
                        if thread.free:
                            self._orphan(thread, ctx.keys)
                g = thread
            old = bg.get(b)
            if old is not g:
                if old is not None:
                    old.n -= 1
                bg[b] = g
                g.n += 1

    def _orphan(self, thread: Group, keys: Sequence[Hashable]) -> None:
        """The session's thread with this agent continues without its free blocks (the
        new prompt did not hit them). Those whose key the new prompt holds (behind an
        evicted block: the request recomputes them) are duplicates, dead at once; the
        rest (a branch the prompt left) move to a new stale group of the session."""
        free = thread.free
        thread.free = OrderedDict()
        bk = getattr(getattr(self, "pool", None), "block_key", None)
        dup: OrderedDict[int, tuple[int, float]] = OrderedDict()
        if bk is not None:
            ks = set(keys)
            for b in [b for b in free if bk[b] in ks]:
                dup[b] = free.pop(b)
        for part, kind in ((free, STALE), (dup, DUP)):
            if not part:
                continue
            self._stale_seq += 1  # a group per orphaning: each stays in free order
            key = (kind, self._stale_seq)
            st = thread.sess.groups[key] = Group(kind, key, thread.sess, None)
            bg = self._bgroup
            for b in part:
                bg[b] = st
            st.free = part
            k = len(part)
            thread.n -= k
            st.n += k
            if kind == STALE:
                self._stale_n += k
            self._touched[id(st)] = st
        thread.ver += 1
        self._nonempty.pop(id(thread), None)
        self._touched[id(thread)] = thread

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        bg = self._bgroup
        touched = self._touched
        t = ctx.now_s
        seq = self._seq
        for b in blocks:
            g = bg[b]
            seq += 1
            if not g.free:
                touched[id(g)] = g
            g.free[b] = (seq, t)
        self._seq = seq

    def on_request_done(self, ctx: RequestContext) -> None:
        rid = ctx.request_id
        if rid is not None and rid in self._queued:
            self._release(rid)
        cur = self._reqs.pop(rid, None) if rid is not None else None
        if rid is not None:
            self._done[rid] = None
            if len(self._done) > MAX_LIVE_REQUESTS:
                self._done.popitem(last=False)
        now = self._now
        if cur is not None:
            sess, agent, _ = cur
            sess.inflight = max(0, sess.inflight - 1)
            if not ctx.warmup:
                sess.last_s = max(sess.last_s, ctx.now_s)
            touched = self._touched
            for g in sess.groups.values():
                touched[id(g)] = g
            if agent is not None and agent.group is not None:
                touched[id(agent.group)] = agent.group
        self._flush(now)
        if self._cur is cur:
            self._cur = None

    def _flush(self, now: float) -> None:
        touched = self._touched
        if not touched:
            return
        for g in touched.values():
            if g.free:
                self._score(g, now)
                self._push(g)
            else:
                self._nonempty.pop(id(g), None)
            if g.n <= 0 and not g.free:
                self._drop_group(g)
        touched.clear()

    # -- victims --------------------------------------------------------------------------

    def pop_victim(self) -> int | None:
        if self._touched:
            self._flush(self._now)
        n = self._pops_since = self._pops_since + 1
        if n > 1024 and n > 4 * len(self._nonempty):
            self._rescore()
        if self._turn_t0 is None:
            self._turn_t0 = self._now
        self._turn_n += 1
        if self._turn_n >= self._capacity:
            self._turnover_tick()
        heap = self._heap
        while heap:
            top = heap[0]
            g = top[3]
            free = g.free
            if top[2] != g.ver or not free:
                heapq.heappop(heap)
                continue
            b = free.popitem(last=False)[0]
            g.ver += 1
            if free:
                seq, t = next(iter(free.values()))
                K = g.K
                if K is None:
                    if self._plain:
                        ep = self._epoch
                        age = ep - t
                        K = ep + (g.mult * age if age > 0 else 0.0) + g.add
                    else:
                        K = self._recency_K(g, t)
                heapq.heapreplace(heap, (-K, seq, g.ver, g))
            else:
                heapq.heappop(heap)
                self._nonempty.pop(id(g), None)
            return b
        return None

    def on_evicted(self, block: int, key: Hashable) -> None:
        g = self._bgroup.pop(block, None)
        if g is not None:
            if g.kind == STALE:  # remember it: a later request for it is still a reuse
                gh = self._ghost
                gh[key] = None
                if len(gh) > self._capacity:
                    gh.popitem(last=False)
            g.n -= 1
            if g.n <= 0 and not g.free:
                self._drop_group(g)
        self._out_blocks.discard(block)

    def _entry(self, g: Group) -> tuple:
        seq, t = next(iter(g.free.values()))
        K = g.K
        if K is None:
            K = self._recency_K(g, t)
        return (-K, seq, g.ver, g)

    def _recency_K(self, g: Group, t: float) -> float:
        """Recency score of a group whose front block was freed at ``t``: ``epoch +
        mult * T(age) + add`` with ``T(age) = age`` (``recency_scale_s`` inf) or
        ``s * (exp(age / s) - 1)``; beyond ``horizon_s``: inf (far reuse)."""
        ep = self._epoch
        age = ep - t
        if age < 0:
            age = 0.0
        sc = self.recency_scale_s
        if sc != INF:
            x = age / sc
            age = sc * math.expm1(x) if x < 700 else INF
        T = g.mult * age + g.add
        if T > self.horizon_s:
            return INF
        return ep + T

    def _push(self, g: Group) -> None:
        g.ver += 1
        self._nonempty[id(g)] = g
        heapq.heappush(self._heap, self._entry(g))

    def _turnover_tick(self) -> None:
        """Called after every ``capacity`` victims: one cache turnover."""
        dt = self._now - self._turn_t0
        self._turnover_s = dt if self._turnover_s == INF else 0.7 * self._turnover_s + 0.3 * dt
        self._turn_t0 = self._now
        self._turn_n = 0

    def _rescore_interval(self) -> float:
        """A quarter of the cache turnover time, or the median session gap if shorter
        (absolute scores of waiting sessions go stale on that scale)."""
        iv = self._turnover_s / 4
        h = self.gaps.global_hist
        if self.sig.gaps and h.n >= self.gaps.min_samples:
            med = self._gap_median
            if med is None or h.n >= 2 * self._gap_median_n:
                med = self._gap_median = h.quantile(0.5)
                self._gap_median_n = h.n
            if med < iv:
                iv = med
        return iv

    def _rescore(self) -> None:
        now = self._now
        if self._touched:  # a hit may have emptied a group since the last flush
            self._flush(now)
        self._epoch = now
        self._pops_since = 0
        if self.r_min > 0:
            self._R = self.trans.predictability_fast()
        self._sweep_ended(now)
        heap = []
        for g in self._nonempty.values():
            self._score(g, now)
            g.ver += 1
            heap.append(self._entry(g))
        heapq.heapify(heap)
        self._heap = heap

    # -- scores ---------------------------------------------------------------------------

    def _score(self, g: Group, now: float) -> None:
        """Set ``g.K`` = predicted absolute next-use time, or None (recency)."""
        if g.hold > 0:  # a queued request hits it at admission: needed before anything
            g.K = -INF
            g.mult, g.add = 1.0, 0.0
            return
        sig = self.sig
        kind = g.kind
        T = None
        mult, add = 1.0, 0.0
        trans = sig.transitions and self._R >= self.r_min
        p_use = 1.0  # P(the group's owner calls it at all), for the survival test
        if kind == OUTPUT:
            if sig.dead_outputs and self._outputs_dead():
                T = INF
            elif sig.gaps and g.sess.ended:
                T = INF
        elif kind == DUP:
            T = INF
        elif kind == STALE:
            if self._stale_dead():
                T = INF
            else:  # the session's wait per expected reuse of a skipped block
                q = self._stale_reuse()
                if sig.gaps:
                    T = self._session_wait(g.sess, now)
                if T is None:
                    pr = self._return_probability(g.sess, now) if sig.gaps else 1.0
                    mult = 1.0 / max(pr * q, 0.02)
                elif T != INF:
                    T = T / q
        elif kind == THREAD:
            sess = g.sess
            if sig.gaps:
                T = self._session_wait(sess, now)
                if T is None:
                    mult = 1.0 / max(self._return_probability(sess, now), 0.02)
            if trans and g.agent is not None and T != INF:
                p, steps = self._thread_reach(sess, g.agent.fp)
                if p is not None:
                    p = max(p, 0.02)
                    p_use = p
                    extra = (steps - 1) * self.step_gap
                    if T is None:
                        mult, add = mult / p, extra / p
                    else:
                        T = (T + extra) / p
            if self.survival_threshold > 0 and T != INF:
                if self._thread_survival(sess, now) * p_use < self.survival_threshold:
                    T = INF  # low survival
        else:  # ANCHOR
            if sig.anchors:
                a = g.agent
                if a.n >= 3 and a.ia < INF:
                    T = min(a.ia, max(0.0, now - a.last_s))
                if T is not None:
                    if trans and self.step_gap > 0:
                        rate = 0.0
                        for i, n_i in self.at_agent.items():
                            rate += n_i * self.trans.prob(i, a.fp)
                        if rate > 0:
                            T = min(T, self.step_gap / rate)
                    if (self.survival_threshold > 0 and T > 0
                            and -math.expm1(-self.horizon_s / T) < self.survival_threshold):
                        T = INF  # low survival (Poisson reuse at rate 1 / T)
        if T is not None and T > self.horizon_s:
            T = INF  # far reuse
        # in the epoch frame, like the recency keys: a recency group freed since the last
        # re-scoring reads K = epoch, so now + T would put every scored group (anchors
        # first) ahead of all of them for eviction until the next re-scoring
        g.K = None if T is None else self._epoch + T
        g.mult, g.add = mult, add

    def _thread_reach(self, sess: Session, fp: Hashable) -> tuple[float | None, float]:
        """(P(the session calls agent ``fp`` within two steps), expected steps given
        that), or (None, 1): unknown. Another agent's thread: the learned reach from the
        session's current agent; the current agent's own thread: ``_stay``."""
        cur = sess.agent
        if cur is None:
            return None, 1.0
        if cur != fp:
            return self._reach(cur, fp)
        return self._stay(sess)

    def _reach_k(self) -> int:
        """Steps over which transitions count: ``reach_steps``, or with ``"turnover"`` the
        steps a session takes in one cache turnover, ``turnover / step_gap`` rounded down to
        a power of two (few distinct values: the reach tables are memoised per value),
        capped at 32, once that is at least 4 (else, and until both are measured, 2)."""
        k = self.reach_steps
        if k != "turnover":
            return k
        g, tv = self.step_gap, self._turnover_s
        if g <= 0 or tv == INF or tv < 4 * g:
            return 2
        return min(32, 1 << (int(tv / g).bit_length() - 1))

    def _reach(self, i: Hashable, j: Hashable) -> tuple[float, float]:
        """(P(a session at agent ``i`` calls ``j`` within ``_reach_k()`` steps), expected
        steps given that)."""
        k = self._reach_k()
        if k <= 2:
            return self.trans.reach_fast(i, j)
        return self.trans.hit_fast(i, j, k)

    def _thread_survival(self, sess: Session, now: float) -> float:
        """P(the session's next request comes within ``horizon_s`` | idle so far), from the
        histogram it is scored by (per tool, else all gaps); 1 while nothing is learned."""
        if sess.ended:
            return 0.0
        h = self.gaps.specific(sess.tool, sess.cluster) if self.sig.tools else None
        if h is None:
            h = self.gaps.global_hist
            if h.n < self.gaps.min_samples:
                return 1.0
        return h.p_within(max(0.0, now - sess.last_s), self.horizon_s)

    def _stay(self, sess: Session) -> tuple[float | None, float]:
        """(P(the session calls its current agent again within two steps), expected
        steps), conditioned on whether a tool is pending; None until learned."""
        st = self.stay
        tot = st.row_total(sess.state)
        if tot < 8 or not self.gaps.tools_seen:  # without tools: measured worse (ChatDev)
            return None, 1.0
        p1 = (st.count(sess.state, True) + st.eps) / (tot + 2 * st.eps)
        p_all, s_all = self._reach(sess.agent, sess.agent)
        p_one = self.trans.prob(sess.agent, sess.agent)
        p2 = max(0.0, p_all - p_one)  # back after leaving (2 or more steps)
        s2 = 2.0
        if p2 > 0 and self._reach_k() > 2:
            s2 = max(2.0, (p_all * s_all - p_one) / p2)
        p = p1 + (1.0 - p1) * p2
        steps = (p1 + s2 * (1.0 - p1) * p2) / p if p > 0 else 2.0
        return p, steps

    def _session_wait(self, sess: Session, now: float) -> float | None:
        """Expected wait until the session's next request, or None (no better than
        recency). Ended sessions: inf. Only tool- or cluster-specific histograms count as
        a signal; the global gap histogram orders sessions like recency does, and
        mixing its absolute scale with recency-ordered groups measured worse."""
        if sess.ended:
            return INF
        if sess.n == 0:
            return None
        h = self.gaps.specific(sess.tool, sess.cluster) if self.sig.tools else None
        e = max(0.0, now - sess.last_s)
        if h is not None:
            return h.expected_wait_fast(e)
        mode = self._gap_mode()
        if mode == "wait":
            if sess.n == 1 and self._first_ready():
                return self._first.expected_wait_fast(e)
            g = self.gaps.histogram()
            if g is not None and g.informative():
                return g.expected_wait_fast(e)
        return None

    def _gap_mode(self) -> str:
        mode = self.global_gaps
        if mode == "auto":
            if self.gaps.global_hist.n < self.wait_min_gaps:
                return "survival"  # too few gaps for absolute waits to beat recency
            if self.gaps.tool_fraction >= 0.1:
                return "wait"
            med = self._gap_median
            if med is not None and self._turnover_s < self.turnover_gap_ratio * med:
                return "wait"  # a small cache: sessions cannot stay across a gap anyway
            return "survival"
        return mode

    def _first_ready(self) -> bool:
        """The gaps after sessions' first requests (and first-request ends) are learned."""
        f = self._first
        return self.sig.first and f.n + f.ends >= self.gaps.min_samples and f.n >= 2

    def _return_probability(self, sess: Session, now: float) -> float:
        """P(the session comes back | idle for e) from all learned gaps and ends; 1 when
        too little is learned."""
        h = self.gaps.global_hist
        if self._gap_mode() != "survival" or h.n < self.gaps.min_samples or sess.n == 0:
            return 1.0
        return h.p_return(max(0.0, now - sess.last_s))

    def _stale_reuse(self) -> float:
        """Learned P(a skipped block is requested again within a cache's worth of
        evictions); 1 until ``dead_min_samples`` skipped blocks are seen."""
        n = self._stale_n
        if n < self.dead_min_samples:
            return 1.0
        return max((self._stale_hits + 1) / (n + 2), 0.02)

    def _stale_dead(self) -> bool:
        n = self._stale_n
        return (n >= self.dead_min_samples
                and (self._stale_hits + 1) / (n + 2) < self.dead_max_reuse)

    def _outputs_dead(self) -> bool:
        n = self._out_n
        return n >= self.dead_min_samples and (self._out_hits + 1) / (n + 2) < self.dead_max_reuse

    def _sweep_ended(self, now: float) -> None:
        if not self.sig.gaps and not self.sig.transitions:
            return
        h = self.gaps.global_hist
        if h.n < self.gaps.min_samples:
            return
        horizon = self.end_factor * h.quantile(0.99)
        for s in self.sessions.values():
            if not s.ended and s.n and now - s.last_s > horizon:
                self._end_session(s)

    def _end_session(self, s: Session) -> None:
        s.ended = True
        self.gaps.observe_end(s.tool, s.cluster)
        if s.n == 1:
            self._first.add_end()
        if s.agent is not None and self.sig.transitions:
            self.trans.observe(s.agent, END)
            self._at_dec(s.agent)

    # -- tables ---------------------------------------------------------------------------

    def _session(self, sid: Hashable) -> Session:
        ss = self.sessions
        s = ss.get(sid)
        if s is None:
            s = ss[sid] = Session(sid)
            if len(ss) > self.max_sessions:
                _, old = ss.popitem(last=False)
                if not old.ended and old.n:
                    self._end_session(old)
        else:
            ss.move_to_end(sid)
        return s

    def _agent(self, fp: Hashable) -> Agent:
        ag = self.agents
        a = ag.get(fp)
        if a is None:
            a = ag[fp] = Agent(fp)
            if len(ag) > self.max_agents:
                ag.popitem(last=False)
        else:
            ag.move_to_end(fp)
        return a

    def _group(self, sess: Session, kind: int, agent: Agent | None) -> Group:
        key = (kind, agent.fp if (agent is not None and kind == THREAD
                                  and self.sig.transitions) else None)
        g = sess.groups.get(key)
        if g is None:
            g = sess.groups[key] = Group(kind, key, sess, agent)
        return g

    def _anchor_group(self, agent: Agent) -> Group:
        g = agent.group
        if g is None:
            g = agent.group = Group(ANCHOR, agent.fp, None, agent)
        return g

    def _drop_group(self, g: Group) -> None:
        self._nonempty.pop(id(g), None)
        if g.kind == ANCHOR:
            if g.agent.group is g:
                g.agent.group = None
        else:
            if g.sess.groups.get(g.key) is g:
                del g.sess.groups[g.key]

    # -- protocol extras ------------------------------------------------------------------

    def eviction_order(self) -> Iterable[int]:
        if self._touched:
            self._flush(self._now)
        heap = []
        for g in self._nonempty.values():
            items = list(g.free.items())
            if items:
                heap.append((self._key_at(g, items[0][1]), 0, items, g))
        heapq.heapify(heap)
        out = []
        while heap:
            _, i, items, g = heapq.heappop(heap)
            out.append(items[i][0])
            if i + 1 < len(items):
                heapq.heappush(heap, (self._key_at(g, items[i + 1][1]), i + 1, items, g))
        return out

    def _key_at(self, g: Group, st: tuple[int, float]) -> tuple[float, int]:
        seq, t = st
        K = g.K
        if K is None:
            K = self._recency_K(g, t)
        return (-K, seq)

    def reset(self) -> None:
        for g in list(self._nonempty.values()):
            g.free.clear()
            g.ver += 1
        self._nonempty.clear()
        self._heap.clear()
        self._bgroup.clear()
        self._out_blocks.clear()
        for s in self.sessions.values():
            s.groups.clear()
        for a in self.agents.values():
            a.group = None

    def model_state_bytes(self) -> int:
        """Learned model: agent stats, transitions, stay probabilities, gap histograms."""
        return (self.trans.state_size_bytes() + self.stay.state_size_bytes()
                + self.gaps.size_bytes() + 40 * len(self.agents))

    def state_size_bytes(self) -> int:
        """Model plus per-session scalars (64 B per tracked session, at most
        ``max_sessions``); the per-key prefix table and per-block group map are side
        tables and not counted."""
        return self.model_state_bytes() + 64 * len(self.sessions)

    @property
    def turnover_s(self) -> float:
        return self._turnover_s
