"""`hybrid-oracle`: `hybrid` handed ground truth that no online policy has (OFFLINE: a
reference for the oracle ladder in sequential replay, never a default).

Specification
-------------
Inputs: the replay's contexts (``contexts``, as ``belady`` and ``cachewise-oracle`` get
them), read ahead of time, including ``agent_truth`` (the trace's agent label). Everything
else is ``hybrid`` (``anchorage.policies.group_eviction``: same groups, same learning, same
scores) except where a piece of knowledge named in ``know`` replaces a learned estimate:

- ``tool``: the exact tool time. A session whose last request called a tool and that
  comes back is scored by its true wait: ``T = t_next - now`` (``t_next``: the session's
  next request); a session that ends after a tool call keeps hybrid's learned estimate
  (its end is ``end``'s knowledge, not the tool's).
- ``end``: whether a request is its session's last. When it completes, the session is
  ended at once (as hybrid ends it after ``end_factor`` x p99 idle time): its threads and
  outputs get ``K = inf``.
- ``next``: the session's next agent ``n`` (a label, mapped to the fingerprint observed
  with it). Thread of ``n``: reach ``p = 1`` in 1 step; any other agent ``f``: hybrid's
  learned reach from ``n`` to ``f``, one step later (``steps + 1``). Sessions whose next
  request is unknown (they end) keep hybrid's reach.
- ``thread``: the exact next-use time of each thread (session ``s``, agent ``f``): ``K =
  t`` of the session's next request with agent ``f`` (absolute, the frame of the
  epoch-relative keys), ``K = inf`` if there is none.
- ``anchor``: the exact next-use time of each agent's anchor: ``K = t`` of the next request
  with that agent in any session, ``inf`` if none.

``know`` is a comma-separated subset of those names, or a ladder level ``L0`` .. ``L5``
(cumulative: ``L1`` = tool, ``L2`` = tool,end, ``L3`` = +next, ``L4`` = +thread, ``L5`` =
+anchor; ``L0`` = nothing = ``hybrid``). Default ``L5``. What remains between ``L5`` and
``belady`` is block granularity: which blocks of a group come back (branches, compaction,
generated-token blocks, partial prefixes) and the order inside a group.

Times are read on the trace clock (as ``belady`` and ``cachewise-oracle`` without
``next_gap_s``): exact in sequential replay, not in the timed simulator's closed loop.
Agent labels map to fingerprints by the last one observed with the label, so where one
label has many prompt prefixes (ChatDev's phases) ``next`` and ``anchor`` are unreliable.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Sequence
from typing import Any

from anchorage.policies.base import RequestContext, next_in_session
from anchorage.policies.group_eviction import ANCHOR, THREAD, Group, Session
from anchorage.policies.hybrid import HybridPolicy

INF = math.inf
KNOWLEDGE = ("tool", "end", "next", "thread", "anchor")
LADDER = {f"L{i}": KNOWLEDGE[:i] for i in range(len(KNOWLEDGE) + 1)}


def parse_know(know: str | Sequence[str]) -> frozenset[str]:
    """``"L3"`` or ``"tool,end"`` (or a sequence of names) -> the set of knowledge names;
    an unknown name is a ValueError listing the accepted ones."""
    if isinstance(know, str):
        if know in LADDER:
            return frozenset(LADDER[know])
        parts = [k.strip() for k in know.split(",") if k.strip()]
    else:
        parts = list(know)
    bad = [k for k in parts if k not in KNOWLEDGE]
    if bad:
        raise ValueError(f"know: unknown knowledge {', '.join(map(repr, bad))}; accepted: "
                         f"{', '.join(KNOWLEDGE)} or a level {', '.join(LADDER)}")
    return frozenset(parts)


class HybridOraclePolicy(HybridPolicy):
    """Reads the future (see the module spec): a reference only."""

    name = "hybrid-oracle"
    offline = True

    def __init__(self, contexts: Sequence[RequestContext], block_size: int = 16,
                 know: str | Sequence[str] = "L5", **params: Any):
        super().__init__(block_size=block_size, **params)
        self.know = parse_know(know)
        n = len(contexts)
        self._next_s = [INF] * n          # the session's next request time
        self._next_agent: list[Any] = [None] * n
        self._last = [False] * n          # the session's last request
        self._tool = [False] * n
        following = next_in_session(contexts)
        for c in contexts:
            if c.session_id is None or not 0 <= c.seq < n:
                continue
            m = following[c.seq]
            if m is not None:
                self._next_s[c.seq], self._next_agent[c.seq] = m.now_s, m.agent_truth
            self._last[c.seq] = m is None
            self._tool[c.seq] = c.tool_name is not None
        # (session, agent) -> sorted (seq, time) of its requests; agent -> sorted times
        self._thread_seqs: dict[tuple[Any, Any], list[int]] = {}
        self._thread_ts: dict[tuple[Any, Any], list[float]] = {}
        self._agent_ts: dict[Any, list[float]] = {}
        for c in sorted(contexts, key=lambda c: c.seq):
            if c.agent_truth is None:
                continue
            if c.session_id is not None:
                k = (c.session_id, c.agent_truth)
                self._thread_seqs.setdefault(k, []).append(c.seq)
                self._thread_ts.setdefault(k, []).append(c.now_s)
            self._agent_ts.setdefault(c.agent_truth, []).append(c.now_s)
        for ts in self._agent_ts.values():
            ts.sort()
        self._truth_of: dict[Hashable, Any] = {}  # fingerprint -> agent label
        self._fp_of: dict[Any, Hashable] = {}     # agent label -> fingerprint
        self._sid_of: dict[int, Any] = {}         # id(Session) -> trace session id

    # -- what the oracle observes ---------------------------------------------------------

    def on_request(self, ctx: RequestContext) -> None:
        super().on_request(ctx)
        cur = self._cur
        if cur is None:
            return
        sess, agent, _ = cur
        if ctx.session_id is not None:
            self._sid_of[id(sess)] = ctx.session_id
        if agent is not None and ctx.agent_truth is not None:
            self._truth_of[agent.fp] = ctx.agent_truth
            self._fp_of[ctx.agent_truth] = agent.fp

    def on_request_done(self, ctx: RequestContext) -> None:
        if "end" in self.know and 0 <= ctx.seq < len(self._last) and self._last[ctx.seq]:
            cur = self._reqs.get(ctx.request_id) if ctx.request_id is not None else None
            if cur is not None and not cur[0].ended:
                sess = cur[0]
                super().on_request_done(ctx)  # sets last_s, then end it before re-scoring
                self._end_session(sess)
                for g in sess.groups.values():
                    self._touched[id(g)] = g
                self._flush(self._now)
                return
        super().on_request_done(ctx)

    # -- scores ---------------------------------------------------------------------------

    def _seq_ok(self, sess: Session) -> bool:
        return 0 <= sess.last_seq < len(self._next_s)

    def _session_wait(self, sess: Session, now: float) -> float | None:
        if ("tool" in self.know and not sess.ended and self._seq_ok(sess)
                and self._tool[sess.last_seq] and self._next_s[sess.last_seq] < INF):
            # in the frame of K = epoch + T: K is the true next request time
            return max(0.0, self._next_s[sess.last_seq] - self._epoch)
        return super()._session_wait(sess, now)

    def _thread_reach(self, sess: Session, fp: Hashable) -> tuple[float | None, float]:
        if "next" in self.know and self._seq_ok(sess):
            nfp = self._fp_of.get(self._next_agent[sess.last_seq])
            if nfp is not None:
                if nfp == fp:
                    return 1.0, 1.0
                p, steps = self._reach(nfp, fp)
                return p, steps + 1.0
        return super()._thread_reach(sess, fp)

    def _score(self, g: Group, now: float) -> None:
        super()._score(g, now)
        if g.hold > 0 or g.agent is None:
            return
        if g.kind == THREAD and "thread" in self.know:
            sess = g.sess
            truth = self._truth_of.get(g.agent.fp)
            sid = self._sid_of.get(id(sess))
            if truth is None or sid is None:
                return
            seqs = self._thread_seqs.get((sid, truth))
            t = INF
            if seqs:
                i = bisect.bisect_right(seqs, sess.last_seq)
                if i < len(seqs):
                    t = self._thread_ts[(sid, truth)][i]
            g.K, g.mult, g.add = t, 1.0, 0.0
        elif g.kind == ANCHOR and "anchor" in self.know:
            truth = self._truth_of.get(g.agent.fp)
            ts = self._agent_ts.get(truth)
            if not ts:
                return
            i = bisect.bisect_right(ts, now)
            g.K, g.mult, g.add = (ts[i] if i < len(ts) else INF), 1.0, 0.0


def _factory(contexts: Sequence[RequestContext], block_size: int = 16,
             **params: Any) -> HybridOraclePolicy:
    return HybridOraclePolicy(contexts, block_size=block_size, **params)


OFFLINE_POLICIES = {"hybrid-oracle": _factory}
