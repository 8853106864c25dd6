"""`GroupEvictionPolicy`: group-scored eviction, an online approximation of Belady; the
engine behind the presets ``cachescout``, ``cachewise`` and ``hybrid`` (which differ only
in their ``Signals``, ``config``).

Specification
-------------
It wires four parts, each with its own spec: the mechanism (``groups``: groups, free
order, lazy heap, victims), the workload model (``model``, read through ``view``), one
scorer per group kind (``scorers/``) and the re-scoring schedule (``schedule``). Per
notification:

- ``on_request(ctx)``: the model attributes the request to a session and agent and learns
  from it; re-scoring (below) may follow.
- ``on_hit`` / ``on_cached``: blocks are assigned to groups. A prompt's first
  ``anchor_length`` blocks (with an agent) go to ``anchor(f)``; the rest to the session's
  ``thread(s, f)`` (keyed by agent with transitions on); blocks cached under keys the
  prompt does not hold (generated tokens) to ``output(s)``. When a request first reaches
  its thread (signal ``stale``), the thread's free blocks the prompt did not hit are
  *skipped*: those whose key the prompt holds further on go to a new ``dup`` group, the
  rest to a new ``stale`` group (``scorers/dup.py``, ``scorers/stale.py``).
- ``on_freed``: blocks become evictable in their group's free order; a block never assigned
  (vLLM allocated it without a prefix lookup, e.g. its connector path) joins the
  anonymous recency group. ``on_hit`` of a block the policy does not hold free is ignored.
- ``pop_victim``: the mechanism's victim; every victim feeds the cache-turnover estimate
  (``anchorage.pool.turnover.TurnoverEstimator``: the clock starts at the first victim).
- ``on_request_done``: the session's last completion is set, its groups are re-scored.

Each touched group's key: ``-inf`` while a queued request holds it (below); else its
scorer's ``(T, mult, add)`` with ``T > horizon_s`` -> ``inf`` (far reuse), ``K = epoch +
T`` (in the epoch frame, like recency keys, so a group scored between re-scorings is not
put ahead of every recency group), or recency with ``mult``, ``add``.

Queued requests (``on_queued``): the policy learns from the request at once (its arrival
ends the session's gap) and *holds* the groups its prompt will hit, its agent's
``anchor(f)`` and its session's ``thread(s, f)``, until it is admitted (``on_request``
with its id) or finishes.

Re-scoring: all groups with free blocks are re-keyed at ``now`` (``epoch = now``), in full
(the model's ``refresh`` first) or keys only, when ``schedule.Schedule`` says (its spec):
at requests, at victims, and after the events it names. Amortised O(log G) per victim.

Learning never reads ``agent_truth`` or ``tool_duration_ms``; warm-up requests
(``ctx.warmup``) update no statistics.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, Sequence

from anchorage.policies.base import (EvictionPolicy, LearnedCounts, PrefetchSettings,
                                     RequestContext, RequestInsight)
from anchorage.policies.group.config import GroupConfig
from anchorage.policies.group.groups import ANCHOR, DUP, OUTPUT, STALE, THREAD, Group, GroupHeap
from anchorage.policies.group.model import MAX_LIVE_REQUESTS, Agent, Session, WorkloadModel
from anchorage.policies.group.schedule import FULL, Schedule
from anchorage.policies.group.scorers import build_scorers
from anchorage.policies.group.view import ModelView
from anchorage.pool.turnover import TurnoverEstimator

INF = math.inf


class GroupEvictionPolicy(EvictionPolicy):
    name = "group"

    def __init__(self, config: GroupConfig | None = None, *,
                 view: Callable[[WorkloadModel], ModelView] = ModelView):
        cfg = self.config = config or GroupConfig()
        self.name = cfg.name
        self.block_size = cfg.block_size
        tun = cfg.tuning
        self.horizon_s = tun.horizon_s
        self._turnover = TurnoverEstimator()
        self.model = WorkloadModel(cfg.model, cfg.signals, block_size=cfg.block_size,
                                   r_min=tun.r_min, cluster_fn=cfg.cluster_fn,
                                   turnover=self._turnover)
        self.view = view(self.model)
        self._scorers = build_scorers(cfg, self.view)
        known = self.view.known_next_use
        self._known = None if type(self.view).known_next_use is ModelView.known_next_use else known
        self.heap = GroupHeap(tun.recency_scale_s, tun.horizon_s)
        self.heap.on_drop = self._unlink
        self._stale_on = cfg.signals.stale
        self._by_agent = cfg.signals.transitions
        self._stale_seq = 0
        self._out_blocks: set[int] = set()
        self._now = 0.0
        self._pops = 0
        self._sched = Schedule()
        # queued requests (on_queued, not yet admitted) -> the groups they hold
        self._queued: dict[Hashable, tuple[Group, ...]] = {}

    def attach(self, pool) -> None:
        super().attach(pool)
        cap = max(1, pool.capacity_blocks)
        self.model.capacity = cap
        self._turnover.capacity = cap

    # -- request notifications ------------------------------------------------------------

    def on_queued(self, ctx: RequestContext) -> None:
        """Learn from a waiting request now and hold the groups its prompt will hit."""
        self.on_request(ctx)
        rid = ctx.request_id
        cur = self.model.last
        if rid is None or cur is None or rid in self._queued:
            return
        held = [self._thread(cur.session, cur.agent)]
        if cur.agent is not None:
            held.append(self._anchor(cur.agent))
        touch = self.heap.touch
        for g in held:
            g.hold += 1
            touch(g)
        self._queued[rid] = tuple(held)
        while len(self._queued) > MAX_LIVE_REQUESTS:
            self._release(next(iter(self._queued)))

    def _release(self, rid: Hashable) -> None:
        touch = self.heap.touch
        for g in self._queued.pop(rid):
            g.hold -= 1
            touch(g)

    def on_request(self, ctx: RequestContext) -> None:
        rid = ctx.request_id
        if rid is not None and rid in self._queued:
            self._release(rid)  # admitted now: its hits stop being free
        if ctx.now_s > self._now:
            if not self._pops and not self.heap.nonempty and not self.heap.touched:
                # nothing scored yet: the heap's epoch starts at the policy clock's first
                # reading (the engine's clock is monotonic time, far from 0)
                self.heap.epoch = ctx.now_s
                self._sched.start(ctx.now_s)
            self._now = ctx.now_s
        m = self.model
        m.observe_request(ctx, ctx.now_s)
        self._check_first_return()
        now = self._now
        what = self._sched.at_request(now, self.heap.groups_with_free, m.rescore_interval(),
                                      m.rekey_interval(self._pops, now))
        if what:
            self._rescore(full=what == FULL)

    def on_hit(self, ctx: RequestContext, blocks: list[int], were_free: list[int]) -> None:
        if were_free:
            heap = self.heap
            hk = heap.hits_by_kind
            before = hk[STALE]
            heap.unfree(were_free)
            if hk[STALE] != before:
                self.model.stale.hits += hk[STALE] - before
        out = self._out_blocks
        if out:
            n = 0
            for b in blocks:
                if b in out:
                    out.discard(b)
                    n += 1
            self.model.outputs.hits += n
        self._assign(ctx, blocks, 0)

    def on_cached(self, ctx: RequestContext, blocks: list[int], keys: list[Hashable],
                  start: int) -> None:
        ck = ctx.keys
        if start < len(ck) and keys and keys[0] == ck[start]:
            self._assign(ctx, blocks, start)
            return
        # blocks filled by generated tokens
        cur = self.model.request(ctx.request_id)
        sess = cur.session if cur is not None else self.model.session(("anon", ctx.request_id))
        self.heap.assign(blocks, self._group(sess, OUTPUT))
        self._out_blocks.update(blocks)
        self.model.outputs.n += len(blocks)

    def _assign(self, ctx: RequestContext, blocks: list[int], start: int) -> None:
        rid = ctx.request_id
        cur = self.model.requests.get(rid) if rid is not None and blocks else None
        if cur is None:
            return
        agent = cur.agent
        k = min(len(blocks), max(0, cur.anchor_len - start)) if agent is not None else 0
        heap = self.heap
        if k:
            heap.assign(blocks[:k] if k < len(blocks) else blocks, self._anchor(agent))
        if k < len(blocks):
            thread = self._thread(cur.session, agent)
            if thread.orph != ctx.request_id and self._stale_on:
                thread.orph = ctx.request_id
                if thread.free:
                    self._orphan(thread, ctx.keys)
            heap.assign(blocks[k:] if k else blocks, thread)

    def _orphan(self, thread: Group, keys: Sequence[Hashable]) -> None:
        """The thread continues without its free blocks: those whose key the new prompt
        holds are duplicates (``dup``), the rest a branch it left (``stale``)."""
        free = thread.free
        thread.free = OrderedDict()
        bk = self.pool.block_key if self.pool is not None else None
        dup: OrderedDict[int, tuple[int, float]] = OrderedDict()
        if bk is not None:
            ks = set(keys)
            for b in [b for b in free if bk[b] in ks]:
                dup[b] = free.pop(b)
        sess = thread.sess
        for part, kind in ((free, STALE), (dup, DUP)):
            if not part:
                continue
            self._stale_seq += 1  # a group per orphaning: each stays in free order
            key = (kind, self._stale_seq)
            st = sess.groups[key] = Group(kind, key, sess, None)
            self.heap.move_free(thread, part, st)
            if kind == STALE:
                self.model.stale.n += len(part)
        self.heap.detach(thread)

    def on_freed(self, ctx: RequestContext, blocks: list[int]) -> None:
        self.heap.freed(blocks, ctx.now_s)

    def on_request_done(self, ctx: RequestContext) -> None:
        rid = ctx.request_id
        if rid is not None and rid in self._queued:
            self._release(rid)
        info = self.model.request_done(ctx)
        if info is not None:
            self._touch_session(info.session, info.agent)
        self._flush(self._now)

    def end_session(self, sess: Session) -> None:
        """End a session now (the model records its end; its groups are re-scored).
        Offline references only: online, sessions end by idling (``model`` spec)."""
        self.model.end_session(sess)
        self._touch_session(sess, None)
        self._flush(self._now)

    def _touch_session(self, sess: Session, agent: Agent | None) -> None:
        touch = self.heap.touch
        for g in sess.groups.values():
            touch(g)
        if agent is not None and agent.group is not None:
            touch(agent.group)

    # -- groups ---------------------------------------------------------------------------

    def _thread(self, sess: Session, agent: Agent | None) -> Group:
        return self._group(sess, THREAD, agent)

    def _group(self, sess: Session, kind: int, agent: Agent | None = None) -> Group:
        key = (kind, agent.fp if (agent is not None and kind == THREAD
                                  and self._by_agent) else None)
        g = sess.groups.get(key)
        if g is None:
            g = sess.groups[key] = Group(kind, key, sess, agent)
        return g

    def _anchor(self, agent: Agent) -> Group:
        g = agent.group
        if g is None:
            g = agent.group = Group(ANCHOR, agent.fp, None, agent)
        return g

    def _unlink(self, g: Group) -> None:
        """The mechanism dropped an empty group: its owner forgets it."""
        if g.kind == ANCHOR:
            if g.agent.group is g:
                g.agent.group = None
        elif g.sess.groups.get(g.key) is g:
            del g.sess.groups[g.key]

    # -- scores ---------------------------------------------------------------------------

    def _score(self, g: Group, now: float) -> None:
        """Set ``g``'s key (module spec)."""
        if g.hold > 0:  # a queued request hits it at admission: needed before anything
            g.K = -INF
            g.mult, g.add = 1.0, 0.0
            return
        T, mult, add = self._scorers[g.kind].score(g, now)
        if T is not None and T > self.horizon_s:
            T = INF  # far reuse
        g.K = None if T is None else self.heap.epoch + T
        g.mult, g.add = mult, add
        if self._known is not None:
            K = self._known(g, now)
            if K is not None:
                g.K, g.mult, g.add = K, 1.0, 0.0

    def _flush(self, now: float) -> None:
        if self.heap.touched:
            score = self._score
            self.heap.flush(lambda g: score(g, now))

    def _check_first_return(self) -> None:
        self._sched.first_return(self.view.first_return() < 1.0)

    def _rescore(self, full: bool = True) -> None:
        """Re-key every group with free blocks at ``now``; ``full``: refresh the model
        first (``schedule`` spec)."""
        now = self._now
        self._flush(now)  # a hit may have emptied a group since the last flush
        self._sched.done(full, now)
        self.heap.epoch = now
        if full:
            self.model.refresh(now)
        score = self._score
        self.heap.rescore(lambda g: score(g, now), now)

    # -- victims --------------------------------------------------------------------------

    def pop_victim(self) -> int | None:
        heap = self.heap
        sched = self._sched
        if sched.due:
            self._rescore(full=False)
        elif heap.touched:
            self._flush(self._now)
        if sched.at_victim(len(heap.nonempty)):
            self._rescore()
        self._pops += 1
        self._turnover.observe(self._pops, self._now)
        return heap.pop()

    def on_evicted(self, block: int, key: Hashable) -> None:
        g = self.heap.evicted(block)
        if g is not None:
            if g.kind == STALE:  # a later request for it is still a reuse
                self.model.stale_evicted(key)
            elif g.kind == THREAD and g.n <= 0 and g.sess.n == 1:
                self.model.firsts.n += 1  # a one-request session's thread is gone
                self._check_first_return()
        self._out_blocks.discard(block)

    def eviction_order(self) -> Iterable[int]:
        self._flush(self._now)
        return self.heap.order()

    def reset(self) -> None:
        self.heap.clear()
        self._sched.due = True  # what is cached next is scored from this frame on
        self._out_blocks.clear()
        for s in self.model.sessions.values():
            s.groups.clear()
        for a in self.model.agents.values():
            a.group = None

    # -- introspection (``EvictionPolicy``) -----------------------------------------------

    @property
    def turnover_s(self) -> float:
        return self._turnover.turnover_s

    def last_request(self) -> RequestInsight | None:
        cur = self.model.last
        if cur is None:
            return None
        return RequestInsight(cur.session.sid, cur.agent.fp if cur.agent else None,
                              cur.anchor_len)

    def fingerprint_of(self, keys: Sequence[Hashable]) -> Hashable | None:
        return self.model.prefix.fingerprint(keys)

    def predictability(self) -> float:
        return self.model.trans.predictability()

    def next_agent(self, fp: Hashable) -> tuple[Hashable | None, float]:
        return self.model.trans.next_agent(fp)

    def session_agent(self, session_id: Hashable) -> Hashable | None:
        s = self.model.sessions.get(session_id)
        return s.agent if s is not None else None

    def predicted_agents(self, k: int = 3) -> list[tuple[Hashable, float]]:
        trans = self.model.trans
        score: dict[Hashable, float] = {}
        for i, n_i in list(self.model.at_agent.items()):
            for j in trans.agents:
                score[j] = score.get(j, 0.0) + n_i * trans.prob(i, j)
        return sorted(score.items(), key=lambda kv: (-kv[1], str(kv[0])))[:k]

    def protected_blocks(self) -> dict[str, int]:
        m = self.model
        anchor = sum(len(a.group.free) for a in list(m.agents.values()) if a.group is not None)
        session = 0
        for s in list(m.sessions.values()):
            if not s.ended and s.tool is not None:
                session += sum(len(g.free) for g in list(s.groups.values()) if g.kind != ANCHOR)
        return {"anchor": anchor, "session": session}

    def learned_counts(self) -> LearnedCounts:
        return LearnedCounts(agents=len(self.model.agents), sessions=len(self.model.sessions))

    def prefetch_settings(self) -> PrefetchSettings:
        t = self.config.tuning
        return PrefetchSettings(enabled=t.prefetch, rate_per_s=t.prefetch_rate_per_s,
                                r_min=t.r_min)

    def model_state_bytes(self) -> int:
        """Learned model: agent stats, transitions, stay probabilities, gap histograms."""
        return self.model.state_size_bytes()

    def state_size_bytes(self) -> int:
        """Model plus per-session scalars (64 B per tracked session, at most
        ``max_sessions``); the per-key prefix table and per-block group map are side
        tables and not counted."""
        return self.model_state_bytes() + 64 * len(self.model.sessions)
