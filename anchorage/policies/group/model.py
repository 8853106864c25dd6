"""The workload model of group-scored eviction: sessions, agents, gaps, transitions,
learned online from the requests the pool reports. No blocks, no scores (those are the
mechanism's and the scorers'); scorers and observers read it through ``view.ModelView``.

Specification
-------------
Per request (``observe_request``; ``ctx.now_s`` is the policy clock):

- its session: ``ctx.session_id``, else inferred from prefix continuity
  (``PrefixOwnership.infer_session``), else a session of its own; its agent: the prompt's
  fingerprint (``PrefixOwnership.fingerprint``), and the number of leading blocks shared
  across sessions (``anchor_length``). Never the ``agent`` label (``agent_truth``), nor
  the client's agent hint (``agent_hint``): keyed by the hint, ChatDev's half-LRU hit
  rate fell from 34.0 to 27.0 % (an anchor group must be the blocks prompts share;
  docs/research/benchmarks-policies.md, "The client's agent hint in eviction");
- learned from it, unless it is a warm-up (``ctx.warmup``) or a request id seen before (a
  re-scheduled attempt, a preempted request coming back):

  - the session's *gap*, from its last completion to this request (none while an earlier
    request of the session still runs): into the gap histograms (``GapPredictor``: all
    gaps, per pending tool and argument cluster when ``tools`` is on), into the histogram
    of gaps after a session's first request (``first``), and into the mean step gap
    ``g`` (EWMA, weight 0.1); a session counted as ended that comes back retracts its end;
  - the agent's inter-arrival time ``ia_f`` (EWMA, weight 0.05), arrivals and last time;
  - with ``transitions`` on: the session's transition ``prev -> f``
    (``TransitionLearner``, per session), whether it stayed with its agent given (agent,
    tool pending?) (``stay``), and ``N_i``: active sessions per current agent;
  - the session's state: current agent, pending tool and its argument cluster
    (``cluster_fn``; with ``tools`` on), the request's ``seq``.

- a request of the session ending (``request_done``) sets the session's last completion,
  and the time since the previous completion (of any session) goes into ``done_gap``
  (EWMA, weight 0.05): the soonest a session that has not returned can come back.

Sessions idle longer than ``end_factor`` (2) x the 99th percentile of learned gaps are
ended at re-scoring (``refresh``): the gap model records an end (tau = inf), the
transition learner ``i -> END``; they no longer count in ``N_i``.

Reuse counts learned from the blocks (for the output, stale and thread scorers): sessions
of a single request whose thread blocks all left the cache, and those that came back with
a second request (``firsts``); output blocks cached and hit again (``outputs``); skipped
thread blocks and their reuses (``stale``), a reuse being a hit or a request for the key
of one evicted while it is among the last ``capacity`` evicted stale keys (``ghost``).

State is bounded: sessions LRU-capped at ``max_sessions`` (the oldest is ended),
agents at ``max_agents``, tool histograms at ``max_tools``, the prefix table at
``max_prefix_keys``, live and done request ids at ``MAX_LIVE_REQUESTS``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Callable, Hashable

from anchorage.fingerprint import PrefixOwnership
from anchorage.policies.base import RequestContext
from anchorage.policies.gap_predictor import GapHistogram, GapPredictor
from anchorage.policies.group.config import ModelParams, Signals
from anchorage.policies.transitions import END, TransitionLearner
from anchorage.pool.turnover import TurnoverEstimator

INF = math.inf
MAX_LIVE_REQUESTS = 8192  # requests in flight whose context is kept (bounded)


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
        #: the session's groups (the policy's, by group key; the model never reads them)
        self.groups: dict[Hashable, Any] = {}
        self.inflight = 0  # requests of this session admitted and not yet done


class Agent:
    __slots__ = ("fp", "last_s", "ia", "n", "group")

    def __init__(self, fp: Hashable):
        self.fp = fp
        self.last_s = -INF
        self.ia = INF
        self.n = 0
        self.group: Any = None  # the agent's anchor group (the policy's)


class RequestInfo:
    """What the model attributed a live request to."""

    __slots__ = ("session", "agent", "anchor_len")

    def __init__(self, session: Session, agent: Agent | None, anchor_len: int):
        self.session = session
        self.agent = agent
        self.anchor_len = anchor_len


class ReuseCount:
    """Blocks of one class seen (``n``) and reused (``hits``)."""

    __slots__ = ("n", "hits")

    def __init__(self) -> None:
        self.n = 0
        self.hits = 0


class WorkloadModel:
    """Learning from requests (module spec); predictions are in ``view.ModelView``."""

    def __init__(self, params: ModelParams, signals: Signals, *, block_size: int,
                 r_min: float = 0.0,
                 cluster_fn: Callable[[Any, Any], Hashable] | None = None,
                 turnover: TurnoverEstimator | None = None):
        self.params = params
        self.sig = signals
        self.block_size = block_size
        self.r_min = r_min
        self.cluster_fn = cluster_fn
        self.turnover = turnover or TurnoverEstimator()
        self.prefix = PrefixOwnership(params.max_prefix_keys)
        self.gaps = GapPredictor(min_samples=params.min_samples, max_keys=params.max_tools,
                                 no_tool_context=params.no_tool_context)
        self.trans = TransitionLearner(eps=params.eps, max_agents=params.max_agents)
        # P(same agent next | agent, a tool is pending): after a tool call an agent usually
        # continues with its result, otherwise the session moves on
        self.stay = TransitionLearner(eps=params.eps, max_agents=2 * params.max_agents)
        self.first = GapHistogram()  # gaps after a session's first request, and ends
        self.sessions: OrderedDict[Hashable, Session] = OrderedDict()
        self.agents: OrderedDict[Hashable, Agent] = OrderedDict()
        self.at_agent: dict[Hashable, int] = {}  # active sessions per current agent
        self.step_gap = 0.0                      # EWMA of session gaps (s)
        self.done_gap = 0.0                      # EWMA of time between completions (s)
        self._last_done_s: float | None = None
        self.R = 0.0                             # predictability, refreshed at re-scoring
        self.outputs = ReuseCount()
        self.stale = ReuseCount()
        # sessions of one request so far: those whose blocks all left the cache (``n``) and
        # those that came back with a second request (``hits``)
        self.firsts = ReuseCount()
        # keys of evicted stale blocks (ghosts, at most ``capacity``)
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()
        self.capacity = 1
        self.gap_median: float | None = None
        self._gap_median_n = 0
        # per live request, keyed by request id, so requests that overlap (vLLM, the timed
        # simulator) never see each other's session
        self.requests: OrderedDict[Hashable, RequestInfo] = OrderedDict()
        # ids of requests already done: one that comes back was preempted (vLLM and the
        # simulator free a preempted request's blocks) and is not a new turn to learn from
        self._done: OrderedDict[Hashable, None] = OrderedDict()
        self.last: RequestInfo | None = None  # the last request seen (observers)

    # -- requests -------------------------------------------------------------------------

    def observe_request(self, ctx: RequestContext, now: float) -> RequestInfo:
        """Attribute a request to its session and agent, and learn from it."""
        keys = ctx.keys
        learn = not ctx.warmup
        sid = ctx.session_id
        prefix = self.prefix
        if sid is None:
            sid = prefix.infer_session(keys)
            if sid is None:
                sid = ("anon", ctx.request_id)
        limit = min(len(keys), ctx.input_length // self.block_size)
        prefix.observe(keys[:limit], sid)
        gh = self.ghost
        if gh and learn:
            for k in keys[:limit]:
                if k in gh:
                    del gh[k]
                    self.stale.hits += 1
        if limit and ctx.session_id is None:
            prefix.note_tail(keys[limit - 1], sid)
        anchor_len = prefix.anchor_length(keys)
        fp = prefix.fingerprint(keys)
        sess = self.session(sid)
        agent = self.agent(fp) if fp is not None else None
        rid = ctx.request_id
        if rid is not None and (rid in self.requests or rid in self._done):
            learn = False  # a re-scheduled attempt or a preempted request: learnt already
        if learn:
            self._learn(ctx, sess, agent, now)
        info = self.last = RequestInfo(sess, agent, anchor_len)
        if rid is not None:
            reqs = self.requests
            if rid not in reqs:
                sess.inflight += 1
            reqs[rid] = info
            reqs.move_to_end(rid)
            while len(reqs) > MAX_LIVE_REQUESTS:
                _, old = reqs.popitem(last=False)
                old.session.inflight = max(0, old.session.inflight - 1)
        return info

    def _learn(self, ctx: RequestContext, sess: Session, agent: Agent | None,
               now: float) -> None:
        sig = self.sig
        # a gap is the time from the session's last completion to this request; none is
        # observed while an earlier request of the session still runs (or never finished)
        if sess.n and sess.inflight == 0 and sess.last_s > -INF:
            self._learn_gap(sess, max(0.0, now - sess.last_s))
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
        if sess.n == 1:
            self.firsts.hits += 1
        sess.n += 1
        sess.last_seq = ctx.seq
        sess.state = (sess.agent, ctx.tool_name is not None) if sig.tools else (sess.agent, None)
        if sig.tools:
            sess.tool = ctx.tool_name
            sess.cluster = (self.cluster_fn(ctx.tool_name, ctx.tool_args)
                            if self.cluster_fn is not None and ctx.tool_name is not None
                            else None)

    def _learn_gap(self, sess: Session, gap: float) -> None:
        sig = self.sig
        if sess.ended:
            self.gaps.retract_end(sess.tool, sess.cluster)
            if sess.n == 1:
                self.first.remove_end()
            sess.ended = False
            if sess.agent is not None:
                self.at_agent[sess.agent] = self.at_agent.get(sess.agent, 0) + 1
        self.gaps.observe(gap, sess.tool if sig.tools else None,
                          sess.cluster if sig.tools else None)
        if sess.n == 1:
            self.first.add(gap)
        self.step_gap = gap if not self.step_gap else 0.9 * self.step_gap + 0.1 * gap

    def _at_dec(self, fp: Hashable) -> None:
        c = self.at_agent.get(fp, 0) - 1
        if c > 0:
            self.at_agent[fp] = c
        else:
            self.at_agent.pop(fp, None)

    def request(self, rid: Hashable) -> RequestInfo | None:
        return self.requests.get(rid) if rid is not None else None

    def request_done(self, ctx: RequestContext) -> RequestInfo | None:
        """The request finished: its session's last completion is now (not for warm-ups)."""
        rid = ctx.request_id
        info = self.requests.pop(rid, None) if rid is not None else None
        if rid is not None:
            self._done[rid] = None
            if len(self._done) > MAX_LIVE_REQUESTS:
                self._done.popitem(last=False)
        if info is not None:
            sess = info.session
            sess.inflight = max(0, sess.inflight - 1)
            if not ctx.warmup:
                sess.last_s = max(sess.last_s, ctx.now_s)
                last = self._last_done_s
                if last is not None and ctx.now_s >= last:
                    d = ctx.now_s - last
                    self.done_gap = d if not self.done_gap else 0.95 * self.done_gap + 0.05 * d
                self._last_done_s = ctx.now_s
        if self.last is info:
            self.last = None
        return info

    # -- sessions and agents --------------------------------------------------------------

    def session(self, sid: Hashable) -> Session:
        s, old = _lru_get(self.sessions, sid, Session, self.params.max_sessions)
        if old is not None and not old.ended and old.n:
            self.end_session(old)
        return s

    def agent(self, fp: Hashable) -> Agent:
        return _lru_get(self.agents, fp, Agent, self.params.max_agents)[0]

    def end_session(self, s: Session) -> None:
        s.ended = True
        self.gaps.observe_end(s.tool, s.cluster)
        if s.n == 1:
            self.first.add_end()
        if s.agent is not None and self.sig.transitions:
            self.trans.observe(s.agent, END)
            self._at_dec(s.agent)

    def refresh(self, now: float) -> None:
        """At re-scoring: refresh R (when gated) and end sessions idle for too long."""
        if self.r_min > 0:
            self.R = self.trans.predictability_fast()
        sig = self.sig
        if not sig.gaps and not sig.transitions:
            return
        h = self.gaps.global_hist
        if h.n < self.gaps.min_samples:
            return
        horizon = self.params.end_factor * h.quantile(0.99)
        for s in self.sessions.values():
            if not s.ended and s.n and now - s.last_s > horizon:
                self.end_session(s)

    # -- blocks ---------------------------------------------------------------------------

    def stale_evicted(self, key: Hashable) -> None:
        """A skipped block was evicted: a later request for its key is still a reuse."""
        gh = self.ghost
        gh[key] = None
        if len(gh) > self.capacity:
            gh.popitem(last=False)

    def rescore_interval(self) -> float:
        """A quarter of the cache turnover time, or the median session gap if shorter
        (absolute scores of waiting sessions go stale on that scale)."""
        iv = self.turnover.turnover_s / 4
        h = self.gaps.global_hist
        if self.sig.gaps and h.n >= self.gaps.min_samples:
            med = self.gap_median
            if med is None or h.n >= 2 * self._gap_median_n:
                med = self.gap_median = h.quantile(0.5)
                self._gap_median_n = h.n
            if med < iv:
                iv = med
        return iv

    def rekey_interval(self, evictions: int, now: float) -> float:
        """Before the first turnover sample: a quarter of the turnover the ``evictions``
        so far extrapolate to (``TurnoverEstimator.estimate_s``), the keys' own time
        scale while ``rescore_interval`` has none; inf after."""
        tv = self.turnover
        if tv.turnover_s != INF:
            return INF
        return tv.estimate_s(evictions, now) / 4

    def state_size_bytes(self) -> int:
        """Agent stats, transitions, stay probabilities, gap histograms."""
        return (self.trans.state_size_bytes() + self.stay.state_size_bytes()
                + self.gaps.size_bytes() + 40 * len(self.agents))


def _lru_get(table: OrderedDict, key: Hashable, make: Callable[[Hashable], Any],
             cap: int) -> tuple[Any, Any]:
    """``table[key]`` (made if missing, then the most recent), and the entry the cap
    pushed out (or None)."""
    v = table.get(key)
    if v is not None:
        table.move_to_end(key)
        return v, None
    v = table[key] = make(key)
    if len(table) > cap:
        return v, table.popitem(last=False)[1]
    return v, None
