"""`hybrid-oracle`: `hybrid` handed ground truth that no online policy has (OFFLINE: a
reference for the oracle ladder in sequential replay, never a default).

Specification
-------------
Inputs: the replay's contexts (``contexts``, as ``belady`` and ``cachewise-oracle`` get
them), read ahead of time, including ``agent_truth`` (the trace's agent label). Everything
else is ``hybrid`` (``anchorage.policies.group``: same groups, same learning, same scores)
except where a piece of knowledge named in ``know`` replaces a learned estimate (the
model's view, ``TruthView``, answers from the future; ``end`` ends sessions through
``GroupEvictionPolicy.end_session``):

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
from anchorage.policies.group import ANCHOR, THREAD, GroupEvictionPolicy, build_config
from anchorage.policies.group.groups import Group
from anchorage.policies.group.model import Session, WorkloadModel
from anchorage.policies.group.view import ModelView
from anchorage.policies.hybrid import SIGNALS

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


class Truth:
    """The replay read ahead: per ``seq``, the session's next request (time, agent label),
    whether it is the session's last, whether it called a tool; each thread's and each
    agent's request times; and the label <-> fingerprint maps observed so far."""

    def __init__(self, contexts: Sequence[RequestContext]):
        n = len(contexts)
        self.next_s = [INF] * n
        self.next_agent: list[Any] = [None] * n
        self.last = [False] * n
        self.tool = [False] * n
        following = next_in_session(contexts)
        for c in contexts:
            if c.session_id is None or not 0 <= c.seq < n:
                continue
            m = following[c.seq]
            if m is not None:
                self.next_s[c.seq], self.next_agent[c.seq] = m.now_s, m.agent_truth
            self.last[c.seq] = m is None
            self.tool[c.seq] = c.tool_name is not None
        # (session, agent) -> sorted seqs and times of its requests; agent -> sorted times
        self.thread_seqs: dict[tuple[Any, Any], list[int]] = {}
        self.thread_ts: dict[tuple[Any, Any], list[float]] = {}
        self.agent_ts: dict[Any, list[float]] = {}
        for c in sorted(contexts, key=lambda c: c.seq):
            if c.agent_truth is None:
                continue
            if c.session_id is not None:
                k = (c.session_id, c.agent_truth)
                self.thread_seqs.setdefault(k, []).append(c.seq)
                self.thread_ts.setdefault(k, []).append(c.now_s)
            self.agent_ts.setdefault(c.agent_truth, []).append(c.now_s)
        for ts in self.agent_ts.values():
            ts.sort()
        self.truth_of: dict[Hashable, Any] = {}  # fingerprint -> agent label
        self.fp_of: dict[Any, Hashable] = {}     # agent label -> fingerprint
        self.named: set[Any] = set()             # sessions seen with their trace id

    def seq_ok(self, sess: Session) -> bool:
        return 0 <= sess.last_seq < len(self.next_s)


class TruthView(ModelView):
    """``hybrid``'s view with the knowledge in ``know`` read from ``truth``."""

    def __init__(self, model: WorkloadModel, truth: Truth, know: frozenset[str]):
        super().__init__(model)
        self.truth = truth
        self.know = know
        self.epoch_of = lambda: 0.0  # the policy's epoch (set by the policy)

    def session_wait(self, sess: Session, now: float) -> float | None:
        tr = self.truth
        if ("tool" in self.know and not sess.ended and tr.seq_ok(sess)
                and tr.tool[sess.last_seq] and tr.next_s[sess.last_seq] < INF):
            # in the frame of K = epoch + T: K is the true next request time
            return max(0.0, tr.next_s[sess.last_seq] - self.epoch_of())
        return super().session_wait(sess, now)

    def thread_reach(self, sess: Session, fp: Hashable) -> tuple[float | None, float]:
        tr = self.truth
        if "next" in self.know and tr.seq_ok(sess):
            nfp = tr.fp_of.get(tr.next_agent[sess.last_seq])
            if nfp is not None:
                if nfp == fp:
                    return 1.0, 1.0
                p, steps = self.reach(nfp, fp)
                return p, steps + 1.0
        return super().thread_reach(sess, fp)

    def known_next_use(self, g: Group, now: float) -> float | None:
        if g.agent is None:
            return None
        tr = self.truth
        if g.kind == THREAD and "thread" in self.know:
            sess = g.sess
            truth = tr.truth_of.get(g.agent.fp)
            if truth is None or sess.sid not in tr.named:
                return None
            seqs = tr.thread_seqs.get((sess.sid, truth))
            if seqs:
                i = bisect.bisect_right(seqs, sess.last_seq)
                if i < len(seqs):
                    return tr.thread_ts[(sess.sid, truth)][i]
            return INF
        if g.kind == ANCHOR and "anchor" in self.know:
            ts = tr.agent_ts.get(tr.truth_of.get(g.agent.fp))
            if not ts:
                return None
            i = bisect.bisect_right(ts, now)
            return ts[i] if i < len(ts) else INF
        return None


class HybridOraclePolicy(GroupEvictionPolicy):
    """Reads the future (see the module spec): a reference only."""

    offline = True

    def __init__(self, contexts: Sequence[RequestContext], block_size: int = 16,
                 know: str | Sequence[str] = "L5", clusters: Any = None, **params: Any):
        self.know = parse_know(know)
        self.truth = Truth(contexts)
        cfg = build_config("hybrid-oracle", params.pop("signals", SIGNALS),
                           block_size=block_size,
                           cluster_fn=clusters.cluster if clusters is not None else None,
                           **params)
        super().__init__(cfg, view=lambda m: TruthView(m, self.truth, self.know))
        self.view.epoch_of = lambda: self.heap.epoch

    def on_request(self, ctx: RequestContext) -> None:
        super().on_request(ctx)
        ins = self.last_request()
        if ins is None:
            return
        tr = self.truth
        if ctx.session_id is not None:
            tr.named.add(ins.session)
        if ins.fingerprint is not None and ctx.agent_truth is not None:
            tr.truth_of[ins.fingerprint] = ctx.agent_truth
            tr.fp_of[ctx.agent_truth] = ins.fingerprint

    def on_request_done(self, ctx: RequestContext) -> None:
        info = None
        if ("end" in self.know and 0 <= ctx.seq < len(self.truth.last)
                and self.truth.last[ctx.seq]):
            info = self.model.request(ctx.request_id)
            if info is not None and info.session.ended:
                info = None
        super().on_request_done(ctx)
        if info is not None:
            self.end_session(info.session)  # after its last completion is set


def _factory(contexts: Sequence[RequestContext], block_size: int = 16,
             **params: Any) -> HybridOraclePolicy:
    return HybridOraclePolicy(contexts, block_size=block_size, **params)


OFFLINE_POLICIES = {"hybrid-oracle": _factory}
