"""The tiering adapter of one simulated replica: the hooks ``anchorage.sim.engine.Replica``
calls, over the replica's block pool, a modelled host tier and the temporal controller.

Specification
-------------
Per replica: a ``HostTier`` (``anchorage.tiering.host_tier``: the keys host memory holds,
one FIFO link each way), a ``TemporalController`` (``anchorage.tiering.controller``: the
stalls, the gate and its inputs, holds, reload timing; turnover clock from 0 s), the
eviction wrapper ``TieredEviction`` around the replica's policy, and per session: its last
prompt's full-block keys, agent, pending tool, when its turn ended, its reload in flight.

- ``store-all`` (``_store_all``): at every turn end, whatever stopped it, the session's
  GPU blocks host memory lacks are copied out (host LRU); no demotion, no warm-up: a
  prompt's continuation in host memory is reloaded at admission (below).
- Turn end (a request completes; its blocks are cached and free): a turn that stopped for
  a tool call (the trace's ``tool_name``/``tool_duration_ms`` presence, the finish reason
  the engine sees; never the duration) opens the session's stall. With GPU blocks left,
  ``naive`` copies all of them, ``naive-incremental`` those host memory lacks, and the
  gated modes fill the controller's readings and act on its plan: ``PoolReading`` from the
  pool (``num_free_blocks``, ``num_cached_free_blocks``), the first ``max_waiting_scan``
  queued requests (incremental demand after their prefix hit, prefill tokens), the prefill
  throughput of a full step, the device-to-host link's queue; ``SessionReading``: the
  leading cached run of the session's keys, those host memory lacks, their recompute time
  (``host_tier.recompute_s``); criticality from the spatial policy (``tokencake``).
  ``offload`` and ``backup`` copy the blocks host memory lacks over the link; when the copy
  completes the keys are in host memory and, for an offload, the session's GPU blocks
  still cached are demoted (``TieredEviction.demote``, priority ``end + idle``, re-keyed to
  arrival + admission wait when the request arrives). ``hold`` holds the session's free
  blocks until ``hold_until`` (released at every step plan once due).
- Warm-up reload at the plan's ``reload_at`` (checked at every step plan: resolution one
  engine step), or at once when the tool returns earlier (the naive modes always then):
  the session's keys missing from GPU memory but held in host memory, if
  ``reload_worth`` (else they are recomputed at admission), are allocated with a
  request-less allocation released at once (cached and free; their data lands when the
  copy completes) and copied over the host-to-device link; never blocks the queue's head
  needs (``reload_no_room``).
- Arrival: the stall closes (``returned``: the gap feeds the forecaster; the transition
  graph in ``tokencake``). Admission: the first admission's wait feeds the controller;
  reloaded blocks the request hits are host hits (``in_time`` / ``late`` by the copy's end,
  ``wasted`` when none is hit); a continuation of the prompt still in host memory is
  reloaded on demand (``late``: the request holds its blocks, it runs once the copy is done).
- Spatial (``tokencake``, every ``spatial_interval_s``): agent scores from the transition
  graph, queueing, usage and active sessions; the reserved pool sized from the pressure and
  split among the critical agents; the waiting queue ordered by ``admission_rank``.

Agents are ``ctx.agent_hint`` (client metadata), else the request's first block key.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from anchorage.policies.base import RequestContext
from anchorage.tiering.controller import (
    PoolReading,
    SessionReading,
    Stall,
    TemporalController,
    pressure,
)
from anchorage.tiering.eviction import TieredEviction
from anchorage.tiering.host_tier import HostTier, block_bytes, recompute_s
from anchorage.tiering.params import TieringConfig
from anchorage.tiering.sim_spatial import SimSpatial


def agent_of(ctx: RequestContext) -> Hashable:
    if ctx.agent_hint:
        return ctx.agent_hint
    return ("fp", ctx.keys[0]) if ctx.keys else None


class _Session:
    __slots__ = ("agent", "args", "demote", "end_s", "keys", "offload_done_s", "offload_n",
                 "offloaded", "pending", "reload_done_s", "reload_hi", "reload_lo",
                 "reload_started", "sid", "stall", "stall_s", "tool", "tool_stop")

    def __init__(self, sid: Hashable):
        self.sid = sid
        self.agent = None
        self.tool = None
        self.args = None
        self.tool_stop = False
        self.end_s = 0.0
        self.keys: tuple = ()
        self.pending = False          # in its stall: the next request has not arrived
        self.stall: Stall | None = None  # the controller's, for a tool stop
        self.offloaded = False        # this stall's blocks were copied out
        self.offload_done_s = 0.0
        self.stall_s = 0.0            # the last copy's predicted idle time
        self.reload_done_s: float | None = None
        self.reload_lo = self.reload_hi = 0  # key range copied from host
        self.reload_started = False
        self.offload_n = 0
        self.demote = True


class SimTiering:
    """One replica's tiering adapter: the hooks of ``anchorage.sim.engine.Replica``."""

    def __init__(self, rep, cfg: TieringConfig, tool_stop: Sequence[bool], links=None):
        from anchorage.sim.costmodel import step_time_s

        self.rep = rep
        self.cfg = cfg
        self.mode = cfg.mode
        self.pool = rep.pool
        self.policy: TieredEviction = rep.pool.policy
        self.bs = rep.pool.block_size
        self.prof = prof = rep.profile
        self.host = HostTier(cfg.host, block_bytes(prof.model, self.bs), links)
        self.bb = self.host.block_bytes
        self.tool_stop = tool_stop
        self.ctl = TemporalController(cfg, self.pool.capacity_blocks, turnover_start_s=0.0)
        self.spatial = (SimSpatial(rep, cfg, self.policy, agent_of)
                        if cfg.mode == "tokencake" else None)
        self.sessions: dict[Hashable, _Session] = {}
        self._d2h: list = []     # (done_s, seq, session) copies out in flight
        self._due: list = []     # (reload_at_s, seq, session) warm-ups to start
        self._seq = 0
        n = prof.max_num_batched_tokens
        self.tokens_per_s = n / step_time_s(prof, [(n, 0)])
        self.gated = cfg.mode in ("temporal", "tokencake")  # the naive modes move everything
        self.offloads = self.offload_blocks = 0
        self.reloads = self.reload_blocks = self.demand_reloads = 0
        self.outcomes: Counter = Counter()
        self.reload_gate: Counter = Counter()  # reload_no_room, reload_low_saving
        self.rep_now = 0.0

    # -- readings -------------------------------------------------------------------------

    def _gpu_run(self, keys) -> int:
        return self.pool.num_hit_blocks(keys, len(keys) * self.bs + 1)

    def _demand(self, r) -> int:
        pool = self.pool
        return max(0, pool.blocks_needed(r.prefill_target)
                   - pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length))

    def _waiting(self) -> list[tuple[int, int]]:
        """The first queued requests: (incremental block demand, prefill tokens)."""
        return [(self._demand(r), r.prefill_target)
                for _, r in zip(range(self.cfg.max_waiting_scan), self.rep.waiting)]

    def _recompute_s(self, lo: int, n: int) -> float:
        """Prefill time of blocks ``[lo, lo + n)`` of a prompt, were they recomputed."""
        return recompute_s(self.prof, lo * self.bs, n * self.bs)

    def _worth_reload(self, lo: int, n: int) -> bool:
        """The reload test for blocks ``[lo, lo + n)``."""
        if not self.gated or self.ctl.reload_worth(self._recompute_s(lo, n), n, self.bb):
            return True
        self.reload_gate["reload_low_saving"] += 1
        return False

    # -- hooks ----------------------------------------------------------------------------

    def on_arrival(self, req) -> None:
        sid = req.session
        if self.spatial is not None:
            self.spatial.sorted = False
        if sid is None:
            return
        st = self.sessions.get(sid)
        now = req.arrival_s
        agent = agent_of(req.ctx)
        if st is None:
            return
        if st.pending:
            st.pending = False
            if st.tool_stop:
                self.ctl.returned(sid, now)
            st.stall = None
            if self.spatial is not None and st.agent is not None:
                self.spatial.transition(st.agent, agent)
            if (st.offloaded and st.demote and self.cfg.queue_wait
                    and math.isfinite(st.stall_s) and now >= st.offload_done_s):
                # back from the tool: its blocks are used at admission, expected in wait_s
                self._demote(st, now + self.ctl.wait_s)
            if st.offloaded and not st.reload_started:
                self._start_reload(st, now)  # the tool returned early: reload at once
        st.agent = agent

    def on_step(self, now: float) -> None:
        self.rep_now = now
        self.ctl.observe_evictions(self.pool.stats.evictions, now)
        if self.policy.held:
            self.policy.release(now)
        d2h = self._d2h
        while d2h and d2h[0][0] <= now:
            _, _, st = heapq.heappop(d2h)
            self._offload_done(st)
        due = self._due
        while due and due[0][0] <= now:
            _, _, st = heapq.heappop(due)
            if st.pending and st.offloaded and not st.reload_started:
                self._start_reload(st, now)
        if self.spatial is not None and self.spatial.due(now):
            self.spatial.update(now, [st.agent for st in self.sessions.values() if st.pending],
                                self._load)

    def next_due_s(self) -> float:
        """The earliest time ``on_step`` has something to do: a copy out completing, a
        warm-up reload due, a held block's deadline, the next spatial update (a decode
        span, ``anchorage.sim.span``, ends there)."""
        t = math.inf
        if self._d2h:
            t = self._d2h[0][0]
        if self._due and self._due[0][0] < t:
            t = self._due[0][0]
        top = self.policy.held.peek() if self.policy.held else None
        if top is not None and top[0] < t:
            t = top[0]
        if self.spatial is not None and self.spatial._next < t:
            t = self.spatial._next
        return t

    @property
    def orders_waiting(self) -> bool:
        """Whether the tier orders the waiting queue (the spatial reservation does);
        otherwise the replica's admission order stands."""
        return self.spatial is not None

    def order_waiting(self, now: float) -> None:
        if self.spatial is not None:
            self.spatial.order_waiting()

    def on_admit(self, req, alloc, now: float) -> tuple[int, int, float]:
        """(warm-up blocks hit, blocks reloaded now, when the request may run)."""
        ready = 0.0
        warm = 0
        if req.preemptions == 0:
            self.ctl.admitted(now - req.arrival_s)
        st = self.sessions.get(req.session) if req.session is not None else None
        if st is not None and st.reload_done_s is not None:
            warm = max(0, min(alloc.hit_blocks, st.reload_hi) - st.reload_lo)
            if warm:
                done = st.reload_done_s
                self.outcomes["in_time" if done <= now else "late"] += 1
                if done > now:
                    ready = done
            else:
                self.outcomes["wasted"] += 1
            st.reload_done_s = None
        keys = req.ctx.keys
        limit = min(len(keys), (req.ctx.input_length - 1) // self.bs)
        host = self.host.run(keys, alloc.hit_blocks, limit)
        if host and not self._worth_reload(alloc.hit_blocks, host):
            host = 0  # recomputed
        if host:
            done = self.host.h2d.schedule(now, host * self.bb)
            self.reloads += 1
            self.demand_reloads += 1
            self.reload_blocks += host
            self.outcomes["late"] += 1
            ready = max(ready, done)
        return warm, host, ready

    def on_turn_end(self, req, now: float) -> None:
        sid = req.session
        if sid is None:
            return
        st = self.sessions.get(sid)
        if st is None:
            st = self.sessions[sid] = _Session(sid)
        ctx = req.ctx
        if st.reload_done_s is not None:
            self.outcomes["wasted"] += 1
            st.reload_done_s = None
        st.agent = agent_of(ctx)
        st.end_s = now
        st.pending = True
        st.offloaded = False
        st.reload_started = False
        st.keys = tuple(ctx.keys[:min(len(ctx.keys), ctx.input_length // self.bs)])
        st.tool_stop = bool(self.tool_stop[req.index]) if req.index < len(self.tool_stop) else False
        st.tool = ctx.tool_name if ctx.tool_name is not None else "tool_use"
        st.args = ctx.tool_args
        st.stall = None
        if self.mode == "store-all":
            self._store_all(st, now)
            return
        if not st.tool_stop:
            return
        st.stall = self.ctl.turn_end(sid, now, st.tool, st.args, agent=st.agent)
        if st.keys:
            self._stall(st, now)

    def _stall(self, st: _Session, now: float) -> None:
        """A tool stall with keys: copy (naive modes) or the controller's plan."""
        n_gpu = self._gpu_run(st.keys)
        if n_gpu == 0:
            return
        held = self.host.held  # this tier's or, with a node scope, a peer's
        n_new = sum(1 for k in st.keys[:n_gpu] if not held(k))
        if self.mode == "naive":  # a swap-out of the whole context, every stall
            self._offload(st, n_gpu, n_gpu, now)
            return
        if self.mode == "naive-incremental":
            self._offload(st, n_gpu, n_new, now)
            return
        pool = self.pool
        reading = PoolReading(
            capacity_blocks=pool.capacity_blocks, free_blocks=pool.num_free_blocks,
            cached_free_blocks=pool.num_cached_free_blocks, block_bytes=self.bb,
            waiting=self._waiting(), tokens_per_s=self.tokens_per_s,
            d2h_wait_s=max(0.0, self.host.d2h.busy_until - now))
        session = SessionReading(gpu_blocks=n_gpu, copy_blocks=n_new,
                                 recompute_s=self._recompute_s(0, n_gpu))
        crit = self.spatial.criticality(st.agent) if self.spatial is not None else 0.0
        self.ctl.observe_evictions(pool.stats.evictions, self.rep_now)
        stall = st.stall
        self.ctl.plan(stall, session, reading, crit)
        act = stall.action
        if act == "offload" or act == "backup":
            self._offload(st, n_gpu, n_new, now, demote=act == "offload")
        elif act == "hold":
            blocks = self._free_blocks(st)
            if blocks:
                self.policy.hold(reversed(blocks), stall.hold_until)

    # -- transfers ------------------------------------------------------------------------

    def _store_all(self, st: _Session, now: float) -> None:
        """``store-all``: every turn's GPU blocks that host memory lacks are copied out
        (vLLM's CPU offloading connector, LMCache, Dynamo's KVBM); nothing is demoted or
        reloaded ahead: a later prompt's continuation in host memory loads at admission."""
        n_gpu = self._gpu_run(st.keys)
        if n_gpu == 0:
            return
        held = self.host.held  # this tier's or, with a node scope, a peer's
        n_new = sum(1 for k in st.keys[:n_gpu] if not held(k))
        if n_new == 0:
            self.host.store(st.keys[:n_gpu])  # refresh their recency
            return
        done = self.host.d2h.schedule(now, n_new * self.bb)
        self.offloads += 1
        self.offload_blocks += n_new
        st.demote = False
        st.offload_n = n_gpu
        self._seq += 1
        heapq.heappush(self._d2h, (done, self._seq, st))

    def _offload(self, st: _Session, n_gpu: int, n_new: int, now: float,
                 demote: bool = True) -> None:
        done = self.host.d2h.schedule(now, n_new * self.bb) if n_new else now
        self.offloads += 1
        self.offload_blocks += n_new
        stall = st.stall
        st.offloaded = True
        st.demote = demote
        st.offload_n = n_gpu
        st.offload_done_s = done
        st.stall_s = stall.idle_s
        self.ctl.offloaded(stall, now, done, st.keys[:n_gpu])
        self._seq += 1
        heapq.heappush(self._d2h, (done, self._seq, st))
        if stall.reload_at is not None:
            self._seq += 1
            heapq.heappush(self._due, (stall.reload_at, self._seq, st))

    def _offload_done(self, st: _Session) -> None:
        self.host.store(st.keys[:st.offload_n])  # what was on GPU when it was decided
        if not st.pending or not st.demote:
            return  # already back (its blocks are in use again), or a backup copy
        self._demote(st, st.end_s + st.stall_s)

    def _free_blocks(self, st: _Session) -> list[int]:
        """The session's cached GPU blocks that are free (its prefix chain, in order)."""
        get, ref = self.pool.get_cached_block, self.pool.ref_cnt
        blocks = []
        for k in st.keys:
            b = get(k)
            if b is None:
                break
            if ref[b] == 0:
                blocks.append(b)
        return blocks

    def _demote(self, st: _Session, reuse_s: float) -> None:
        blocks = self._free_blocks(st)
        if blocks:
            # a chain's tail first, as vLLM frees
            self.policy.demote(reversed(blocks), reuse_s)

    def _start_reload(self, st: _Session, now: float) -> None:
        st.reload_started = True
        keys = st.keys
        n_gpu = self._gpu_run(keys)
        n_host = self.host.run(keys, n_gpu, len(keys))
        if n_host == 0:
            return  # still on GPU (nothing was evicted) or no longer in host memory
        if not self._worth_reload(n_gpu, n_host):
            return  # recomputed at admission, unless the test passes then
        pool = self.pool
        hi = n_gpu + n_host
        # the allocation takes the blocks not on GPU; never those the queue's head needs
        w = self.rep.waiting
        if n_host > pool.num_free_blocks - (self._demand(w[0]) if w else 0):
            self.reload_gate["reload_no_room"] += 1
            return
        ctx = RequestContext(request_id=("reload", st.sid, self._seq), keys=keys[:hi],
                             input_length=hi * self.bs + 1, now_s=now, session_id=st.sid,
                             agent_hint=st.agent if isinstance(st.agent, str) else None,
                             warmup=True)
        self._seq += 1
        alloc = pool.allocate(ctx, hi * self.bs)
        if alloc is None:
            self.reload_gate["reload_no_room"] += 1
            return
        # the blocks are keyed now and their data lands at reload_done_s; they are
        # released at once (cached, free): holding them until the request is admitted
        # can deadlock a full pool whose queue head needs them
        pool.free(alloc)
        pool.sim_free_epoch += 1
        st.reload_lo, st.reload_hi = alloc.hit_blocks, hi
        st.reload_done_s = self.host.h2d.schedule(now, n_host * self.bb)
        self.ctl.moved(st.sid, now)
        self.reloads += 1
        self.reload_blocks += n_host

    def _load(self) -> float:
        pool = self.pool
        return pressure(pool.capacity_blocks, pool.num_free_blocks, self._waiting())

    # -- report ---------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        return {
            "offloads": self.offloads, "offload_blocks": self.offload_blocks,
            "reloads": self.reloads, "reload_blocks": self.reload_blocks,
            "demand_reloads": self.demand_reloads,
            "offload_bytes": self.host.d2h.bytes, "reload_bytes": self.host.h2d.bytes,
            "outcomes": dict(self.outcomes), "gate": dict(self.ctl.gate + self.reload_gate),
            "demoted_evictions": self.policy.demoted_evictions,
            "actions": dict(self.ctl.actions), "held_evictions": self.policy.held_evictions,
            "protected_evictions": self.policy.protected_evictions,
        }
