"""The simulator's host tier as vLLM's ``OffloadingConnector`` runs it (``mode="offload"``
of ``anchorage.tiering.sim.run_tiered``): write-through stores, loads at admission, a
host-memory policy choosing what host memory keeps (``lru``, ``arc``, ``anchorage``,
``oracle``), and Anchorage's temporal part (the gate protecting a stalled session's host
copy, and the just-in-time reload ahead of its return). The hooks are the ones
``anchorage.sim.engine.Replica`` calls.

Specification
-------------
Per replica: a ``HostStore`` (``anchorage.tiering.offload_model``, vLLM's CPU manager) of
``host.capacity_bytes // block_bytes`` chunks (one block per chunk), its policy, the two
links of ``anchorage.tiering.host_tier`` (FIFO, ``latency + bytes / bandwidth``) and a
``SessionReturns`` (``anchorage.tiering.returns``: the sessions, the temporal controller).
A request's id for the host tier is its trace index.

- Arrival: ``returns.request`` (the pending tool: the record's ``tool_name``, else
  ``"tool_use"`` when the turn stops for a tool, the finish reason the engine sees).
- Admission (``on_admit``; the GPU hit is the pool's): vLLM's lookup continues the prompt's
  full blocks from the GPU hit while host memory holds them ready (at most ``(prompt - 1)
  // block_size`` blocks in all: the last token is recomputed); those are loaded
  (``prepare_load``, the host-to-device link; the request runs once the copy is done:
  ``late``, an on-demand reload) and released when it completes. The prompt's remaining
  full blocks are computed and written through (``prepare_store``, the device-to-host
  link; ready, i.e. loadable, when the copy completes; a key still being stored is a
  miss): after a load, once it completed (vLLM computes a loaded request in a later step);
  without a host hit, every full prompt block at once (held ones are reuses).
  Warm-up blocks the GPU hit covers are host hits (``in_time`` when the copy was done
  before admission, else ``late``; ``wasted`` when none is hit).
- Turn end (``on_turn_end``): ``returns.finished`` (``next_gap_s``, the true gap, for
  ``oracle``). The request's host accesses go to the policy (``request_finished``) at the
  start of the step after next, as vLLM's connector reports a finished request in the
  next step's metadata, after that step's stores. With
  ``temporal``, a stall is planned by the controller over the readings (pool: capacity,
  free and cached free blocks, first queued requests, prefill throughput, the d2h link's
  queue; session: its leading full prompt blocks on GPU, those host memory lacks, their
  recompute time) with the host occupancy the controller tracks; an accepted offload
  (``offload``) pins the session's keys in host memory until it returns
  (``TemporalController.offloaded``: evicted after every unpinned key) and schedules the
  warm-up at ``reload_at``.
- Warm-up (``temporal``, at ``reload_at`` or when the tool returns first: checked at each
  step plan): the session's prompt blocks missing on GPU and held in host memory are
  allocated by a request-less allocation released at once (cached, free; the data lands
  when the copy completes) and loaded; never when the free blocks minus the queue head's
  demand are too few (``reload_no_room``).

Counters (``counters()``): ``offload_blocks`` / ``offload_bytes`` (stored chunks),
``reload_blocks`` / ``reload_bytes`` (loaded: on demand and warm-ups), ``reloads``,
``demand_reloads``, ``outcomes``, ``host_evictions``, ``store_failures``, ``gate``,
``actions``.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from anchorage.policies.base import RequestContext
from anchorage.tiering.controller import PoolReading, SessionReading
from anchorage.tiering.host_baselines import ARCHostPolicy, lru_policy
from anchorage.tiering.host_policy import HostPolicy
from anchorage.tiering.host_tier import Link, block_bytes, recompute_s
from anchorage.tiering.offload_model import HostStore
from anchorage.tiering.params import HOST_POLICIES
from anchorage.tiering.returns import SessionReturns



def make_host_policy(name: str, capacity: int, returns: SessionReturns | None, clock):
    if name == "lru":
        return lru_policy(capacity, clock)
    if name == "arc":
        return ARCHostPolicy(capacity)
    if name in ("anchorage", "oracle"):
        return HostPolicy(capacity, returns, clock=clock)
    raise ValueError(f"host policy must be one of {', '.join(HOST_POLICIES)}, got {name!r}")


class _Warm:
    __slots__ = ("done_s", "hi", "lo", "started")

    def __init__(self) -> None:
        self.started = False
        self.done_s: float | None = None
        self.lo = self.hi = 0


class SimOffload:
    def __init__(self, rep, cfg, tool_stop: Sequence[bool],
                 links: tuple[Link, Link] | None = None):
        from anchorage.sim.costmodel import step_time_s

        self.rep, self.cfg, self.tool_stop = rep, cfg, tool_stop
        self.pool = rep.pool
        self.bs = rep.pool.block_size
        self.prof = rep.profile
        self.bb = block_bytes(self.prof.model, self.bs)
        h = cfg.host
        # (d2h, h2d), shared by the replicas behind one host link, or this replica's own
        self.d2h, self.h2d = links or (Link(h.d2h_bytes_s, h.latency_s),
                                       Link(h.h2d_bytes_s, h.latency_s))
        self.now = 0.0
        oracle = cfg.host_policy == "oracle"
        self.returns = SessionReturns(cfg, oracle=oracle)
        self.ctl = self.returns.ctl
        self.ctl.attach(self.pool.capacity_blocks)
        pol = make_host_policy(cfg.host_policy, h.capacity_blocks(self.bb), self.returns,
                               lambda: self.now)
        self.store = HostStore(h.capacity_blocks(self.bb), pol)
        self.temporal = cfg.reload_ahead and cfg.host_policy != "lru" and cfg.host_policy != "arc"
        n = self.prof.max_num_batched_tokens
        self.tokens_per_s = n / step_time_s(self.prof, [(n, 0)])
        self._pending: list = []   # (done_s, seq, kind, keys): stores and loads in flight
        self._finished: list = []  # requests finished in the current step
        self._report: list = []    # ... in the previous one: reported at the next step
        self._due: list = []       # (reload_at, seq, sid)
        self._seq = 0
        self.keys: dict[Hashable, tuple] = {}  # session -> its last prompt's full-block keys
        self.warm: dict[Hashable, _Warm] = {}
        self.outcomes: Counter = Counter()
        self.reload_gate: Counter = Counter()
        self.reloads = self.demand_reloads = self.reload_blocks = self.offload_blocks = 0

    # -- transfers ------------------------------------------------------------------------

    def _later(self, done: float, kind: str, keys) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (done, self._seq, kind, keys))

    def _complete(self, now: float) -> None:
        p = self._pending
        while p and p[0][0] <= now:
            _, _, kind, keys = heapq.heappop(p)
            if kind == "store":
                self.store.complete_store(keys)
            elif kind == "load":
                self.store.complete_load(keys)
            else:  # a loaded request computes the rest: its chunks are offered now
                self._offer(*keys)

    def _offer(self, rid: Any, keys: Sequence[Hashable], now: float) -> None:
        out = self.store.prepare_store(keys, rid)
        if out is not None and out[0]:
            done = self.d2h.schedule(now, len(out[0]) * self.bb)
            self._later(done, "store", out[0])
            self.offload_blocks += len(out[0])

    def _host_run(self, keys: Sequence[Hashable], start: int, limit: int) -> int:
        n = start
        look = self.store.lookup
        while n < limit and look(keys[n]) == "hit":
            n += 1
        return n - start

    def _load(self, keys: Sequence[Hashable], rid: Any, now: float) -> float:
        self.store.prepare_load(keys, rid)
        done = self.h2d.schedule(now, len(keys) * self.bb)
        self._later(done, "load", list(keys))
        self.reloads += 1
        self.reload_blocks += len(keys)
        return done

    # -- hooks ----------------------------------------------------------------------------

    def on_arrival(self, req) -> None:
        ctx = req.ctx
        stop = req.index < len(self.tool_stop) and self.tool_stop[req.index]
        tool = ctx.tool_name if ctx.tool_name is not None else ("tool_use" if stop else None)
        sid = req.session
        self.returns.request(req.index, sid, req.arrival_s, tool=tool, args=ctx.tool_args,
                             warmup=ctx.warmup, agent=ctx.agent_hint)
        w = self.warm.get(sid) if sid is not None else None
        if self.temporal and w is not None and not w.started:
            self._reload(sid, req.arrival_s)  # the tool returned first: reload at once

    def on_step(self, now: float) -> None:
        self.now = now
        self.ctl.observe_evictions(self.pool.stats.evictions, now)
        for rid in self._report:
            self.store.request_finished(rid)
        self._report, self._finished = self._finished, []
        self._complete(now)
        due = self._due
        while due and due[0][0] <= now:
            _, _, sid = heapq.heappop(due)
            w = self.warm.get(sid)
            if w is not None and not w.started:
                self._reload(sid, now)

    def next_due_s(self) -> float:
        """The earliest time ``on_step`` has something to do (a decode span,
        ``anchorage.sim.span``, ends there): finished requests to report to the host
        store (now), a transfer completing, a just-in-time reload due."""
        if self._report or self._finished:
            return self.now
        t = self._pending[0][0] if self._pending else math.inf
        if self._due and self._due[0][0] < t:
            t = self._due[0][0]
        return t

    orders_waiting = False   # the replica's admission order stands

    def order_waiting(self, now: float) -> None:
        return

    def on_admit(self, req, alloc, now: float) -> tuple[int, int, float]:
        self.now = now
        self._complete(now)
        if req.preemptions == 0:
            self.ctl.admitted(now - req.arrival_s)
        ctx = req.ctx
        keys = ctx.keys
        n_full = min(len(keys), ctx.input_length // self.bs)
        limit = min(n_full, (ctx.input_length - 1) // self.bs)
        g = alloc.hit_blocks
        warm, ready = 0, 0.0
        w = self.warm.pop(req.session, None) if req.session is not None else None
        if w is not None and w.done_s is not None:
            warm = max(0, min(g, w.hi) - w.lo)
            self.outcomes["in_time" if warm and w.done_s <= now else
                          "late" if warm else "wasted"] += 1
            if warm and w.done_s > now:
                ready = w.done_s
        h = self._host_run(keys, g, limit)
        if h:
            ready = max(ready, self._load(keys[g:g + h], req.index, now))
            self.demand_reloads += 1
            self.outcomes["late"] += 1
        # vLLM offers the chunks after a host hit once the load is done (the request
        # computes in a later step); without one, every full prompt chunk now (those the
        # GPU hit too: held ones count as reuses, missing ones are stored)
        if h:
            if g + h < n_full:
                self._later(ready, "offer", (req.index, keys[g + h:n_full], ready))
        elif n_full:
            self._offer(req.index, keys[:n_full], now)
        return warm, h, ready

    def on_turn_end(self, req, now: float) -> None:
        self.now = now
        sid = req.session
        st = self.returns.finished(req.index, now, req.next_gap_s)
        self._finished.append(req.index)
        if sid is None:
            return
        ctx = req.ctx
        self.keys[sid] = tuple(ctx.keys[:min(len(ctx.keys), ctx.input_length // self.bs)])
        self.warm.pop(sid, None)
        if st is not None and self.temporal:
            self._plan(st, sid, now)

    # -- the temporal part ----------------------------------------------------------------

    def _plan(self, st, sid: Hashable, now: float) -> None:
        keys = self.keys[sid]
        pool = self.pool
        n_gpu = pool.num_hit_blocks(keys, len(keys) * self.bs + 1)
        look = self.store.lookup
        held = [k for k in keys if look(k) != "miss"]
        waiting = [(max(0, pool.blocks_needed(r.prefill_target)
                        - pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length)), r.prefill_target)
                   for _, r in zip(range(self.cfg.max_waiting_scan), self.rep.waiting)]
        reading = PoolReading(
            capacity_blocks=pool.capacity_blocks, free_blocks=pool.num_free_blocks,
            cached_free_blocks=pool.num_cached_free_blocks, block_bytes=self.bb,
            waiting=waiting, tokens_per_s=self.tokens_per_s,
            d2h_wait_s=max(0.0, self.d2h.busy_until - now))
        blocks = max(n_gpu, len(held))
        session = SessionReading(gpu_blocks=blocks, copy_blocks=max(0, n_gpu - len(held)),
                                 recompute_s=recompute_s(self.prof, 0, blocks * self.bs))
        self.ctl.plan(st, session, reading)
        if st.action != "offload":
            return
        self.ctl.offloaded(st, now, now + st.offload_s, keys)
        if st.reload_at is not None:
            self.warm[sid] = _Warm()
            self._seq += 1
            heapq.heappush(self._due, (st.reload_at, self._seq, sid))

    def _reload(self, sid: Hashable, now: float) -> None:
        w = self.warm[sid]
        w.started = True
        keys = self.keys.get(sid, ())
        pool = self.pool
        n_gpu = pool.num_hit_blocks(keys, len(keys) * self.bs + 1)
        n = self._host_run(keys, n_gpu, len(keys))
        if n == 0:
            del self.warm[sid]
            return
        head = self.rep.waiting[0] if self.rep.waiting else None
        need = (pool.blocks_needed(head.prefill_target)
                - pool.num_hit_blocks(head.ctx.keys, head.ctx.input_length)) if head else 0
        if n > pool.num_free_blocks - max(0, need):
            self.reload_gate["reload_no_room"] += 1
            del self.warm[sid]
            return
        hi = n_gpu + n
        ctx = RequestContext(request_id=("warm", sid, self._seq), keys=keys[:hi],
                             input_length=hi * self.bs + 1, now_s=now, session_id=sid,
                             warmup=True)
        alloc = pool.allocate(ctx, hi * self.bs)
        if alloc is None:
            self.reload_gate["reload_no_room"] += 1
            del self.warm[sid]
            return
        pool.free(alloc)
        pool.sim_free_epoch += 1
        w.lo, w.hi = alloc.hit_blocks, hi
        w.done_s = self._load(keys[alloc.hit_blocks:hi], ("warm", sid, self._seq), now)
        self._finished.append(("warm", sid, self._seq))
        self._seq += 1
        self.ctl.moved(sid, now)

    # -- report ---------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        return {
            "offloads": self.store.stored, "offload_blocks": self.offload_blocks,
            "reloads": self.reloads, "reload_blocks": self.reload_blocks,
            "demand_reloads": self.demand_reloads,
            "offload_bytes": self.d2h.bytes, "reload_bytes": self.h2d.bytes,
            "outcomes": dict(self.outcomes), "gate": dict(self.ctl.gate + self.reload_gate),
            "actions": dict(self.ctl.actions), "host_evictions": self.store.evicted,
            "store_failures": self.store.store_failures,
        }
