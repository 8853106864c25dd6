"""The tiering controller of one simulated replica (the hooks ``anchorage.sim.engine``
calls) and ``run_tiered``, the timed simulation with a host tier.

Specification
-------------
Modes: ``off`` (no host tier: ``anchorage.sim.cluster.run_timed``), ``naive`` (the paper's
plain offload: every turn that ends in a tool call swaps the session's whole context out,
all its GPU blocks copied whatever host memory holds, and back in when the tool returns),
``naive-incremental`` (the same, copying only blocks host memory lacks), ``temporal`` (the
gate and the warm-up reload of ``anchorage.tiering.temporal``, criticality 0) and
``tokencake`` (temporal plus the spatial policy of ``anchorage.tiering.spatial``).

Per replica: a ``HostTier`` (``anchorage.tiering.host_tier``), a ``StallForecaster``, the
eviction wrapper ``TieredEviction`` around the replica's policy, and per session: its last
prompt's full-block keys, agent, pending tool, when its turn ended.

- Turn end (a request completes; its blocks are now cached and free): if the turn stopped
  for a tool call (the finish reason, which the engine sees; the trace's
  ``tool_name``/``tool_duration_ms`` presence, never the duration), the gate decides
  (always yes in the naive modes) on the predicted idle time: the forecaster's stall plus,
  with ``queue_wait`` (default), the replica's admission wait (``forecast.IdleEstimate``,
  which ``TieringConfig`` extends: EWMA, weight ``wait_ewma``
  0.2, of arrival-to-admission times of requests admitted for the first time). An offload
  copies the session's GPU blocks not yet in host memory over the device-to-host link;
  when it completes the keys are in host memory and the session's GPU blocks still cached
  are demoted (evicted first, the furthest predicted reuse first: turn end + idle time,
  re-keyed to arrival + admission wait when the request arrives). A rejected stall gets
  ``temporal.stall_action``: a hold on GPU (``TieredEviction.hold``, released at every
  step plan once due), a backup copy (the same copy, no demotion) or nothing; the
  survival time it uses comes from the pool's evictions (one turnover = ``capacity``
  evictions, EWMA weight 0.3).
- Warm-up reload: at the gate's ``reload_at_s`` (checked at every step plan, so its
  resolution is one engine step), the session's keys missing from GPU memory but held in
  host memory are allocated (a request-less allocation, released at once: the blocks are
  cached and free, their data lands when the copy completes) and copied over the
  host-to-device link. A tool that returns earlier starts the reload at once
  (the naive modes always reload then). Reloads never take blocks the head of the queue needs.
- Arrival: the stall is observed (fed to the forecaster; to the transition graph in
  ``tokencake``). Admission: reloaded blocks the request hits count as host hits (the
  request waits for the transfer if it is still running; ``wasted`` when they were
  dropped before use), and
  any continuation of the prompt still in host memory is reloaded on demand (a late
  reload: the request holds its blocks but is not scheduled until the copy is done).
- Pressure (the gate's ``gpu_usage`` and the reserved pool's feedback): blocks held by
  running requests plus the incremental demand of the first ``max_waiting_scan`` (32)
  queued requests, over the capacity, capped at 1 (a stalled session's blocks are free,
  cached, in vLLM; what evicts them is the queue's demand).
- Host room (the gate's ``host_free_blocks``): the capacity minus the distinct keys of
  sessions copied out and not back yet (a prefix several sessions share counts once).
- Spatial (``tokencake``, every ``spatial_interval_s``): agent scores from the learned
  transition graph, queueing, usage and active sessions; the reserved pool sized from the
  pressure and split among the critical agents (``TieredEviction.set_reservation``); the
  waiting queue ordered by criticality (``admission_rank``); the gate's penalty uses the
  agent's normalised criticality.

Agents are ``ctx.agent_hint`` (client metadata), else the request's first block key.
Reported (``run_tiered``): everything ``run_timed`` reports plus ``tiering`` (mode and
parameters), ``host_hit_rate`` / ``host_hit_blocks`` (prefix blocks served from host
memory, same requests as ``hit_rate``), ``offloads``, ``reloads`` (warm-up and on
demand), ``reload_outcomes`` (``in_time``/``late``/``wasted``), ``offload_bytes``,
``reload_bytes``, ``bytes_moved``, ``gate`` (decisions by reason), ``actions``
(``offload``, ``backup``, ``hold`` counts; ``offloads`` = offload + backup copies),
``reserved_blocks``
(mean and max per agent over spatial updates).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from anchorage.policies.base import RequestContext
from anchorage.policies.transitions import TransitionLearner
from anchorage.tiering import spatial as sp
from anchorage.tiering.eviction import TieredEviction
from anchorage.tiering.forecast import IdleEstimate
from anchorage.tiering.host_tier import (
    HostTier,
    HostTierConfig,
    block_bytes,
    recompute_s,
)
from anchorage.tiering.temporal import (
    GateInput,
    GateParams,
    decide_offload,
    hold_until_s,
    reload_at_s,
    stall_action,
    worth_moving,
)

MODES = ("off", "naive", "naive-incremental", "temporal", "tokencake")


@dataclass(frozen=True)
class TieringConfig(IdleEstimate):
    mode: str = "tokencake"
    host: HostTierConfig = field(default_factory=HostTierConfig)
    gate: GateParams = field(default_factory=GateParams)
    spatial: sp.SpatialParams = field(default_factory=sp.SpatialParams)
    weights: sp.ScoreWeights = field(default_factory=sp.ScoreWeights)
    spatial_interval_s: float = 0.5
    max_waiting_scan: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"tiering mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.spatial_interval_s > 0:
            raise ValueError("spatial_interval_s must be > 0")


def agent_of(ctx: RequestContext) -> Hashable:
    if ctx.agent_hint:
        return ctx.agent_hint
    return ("fp", ctx.keys[0]) if ctx.keys else None


class _Session:
    __slots__ = (
        "agent",
        "args",
        "demote",
        "end_s",
        "keys",
        "last_move_s",
        "offload_done_s",
        "offload_n",
        "offloaded",
        "pending",
        "pinned",
        "reload_done_s",
        "reload_hi",
        "reload_lo",
        "reload_s",
        "reload_started",
        "sid",
        "stall_s",
        "tool",
        "tool_stop",
    )

    def __init__(self, sid: Hashable):
        self.sid = sid
        self.agent = None
        self.tool = None
        self.args = None
        self.tool_stop = False
        self.end_s = 0.0
        self.keys: tuple = ()
        self.pending = False          # in its stall: the next request has not arrived
        self.offloaded = False        # this stall's blocks were offloaded
        self.offload_done_s = 0.0
        self.stall_s = 0.0
        self.reload_s = 0.0
        self.reload_done_s: float | None = None
        self.reload_lo = self.reload_hi = 0  # key range copied from host
        self.reload_started = False
        self.last_move_s = -math.inf
        self.pinned = 0
        self.offload_n = 0
        self.demote = True


class SimTiering:
    """One replica's tiering controller: the hooks of ``anchorage.sim.engine.Replica``."""

    def __init__(self, rep, cfg: TieringConfig, tool_stop: Sequence[bool]):
        self.rep = rep
        self.cfg = cfg
        self.mode = cfg.mode
        self.pool = rep.pool
        self.policy: TieredEviction = rep.pool.policy
        self.bs = rep.pool.block_size
        prof = rep.profile
        self.host = HostTier(cfg.host, block_bytes(prof.model, self.bs))
        self.bb = self.host.block_bytes
        self.tool_stop = tool_stop
        self.forecast = cfg.forecaster()
        self.trans = TransitionLearner()
        self.sessions: dict[Hashable, _Session] = {}
        self._d2h: list = []     # (done_s, seq, session) offloads in flight
        self._due: list = []     # (reload_at_s, seq, session) warm-ups to start
        self._seq = 0
        self.crit: dict[Hashable, float] = {}
        self._next_spatial = 0.0
        self._sorted = True
        from anchorage.sim.costmodel import step_time_s
        n = prof.max_num_batched_tokens
        self.tokens_per_s = n / step_time_s(prof, [(n, 0)])
        self.prof = prof
        self.gated = cfg.mode in ("temporal", "tokencake")  # the naive modes move everything
        # counters
        self.offloads = 0
        self.offload_blocks = 0
        self.reloads = 0
        self.reload_blocks = 0
        self.demand_reloads = 0
        self.outcomes: Counter = Counter()
        self.gate: Counter = Counter()
        self.reserved_sum: Counter = Counter()
        self.reserved_max: Counter = Counter()
        self.spatial_updates = 0
        self.actions: Counter = Counter()  # offload / backup / hold
        self.rep_now = 0.0
        self._ev_mark = 0
        self._ev_t = 0.0
        self._turn = math.inf
        # host blocks of offloaded sessions not yet back (not reclaimable), counted once
        # however many sessions share them (a common system prompt)
        self.pins: Counter = Counter()
        self.wait_s = 0.0  # EWMA of admission waits (arrival to admission) on this replica

    # -- helpers --------------------------------------------------------------------------

    def _gpu_run(self, keys) -> int:
        return self.pool.num_hit_blocks(keys, len(keys) * self.bs + 1)

    def _pressure(self, waiting=None) -> float:
        """GPU memory pressure: blocks held by running requests plus the incremental demand
        of the first queued ones, over the capacity (capped at 1). Held blocks alone
        understate it here: a stalled session's blocks are free (cached) in vLLM, and the
        queue's demand is what would evict them."""
        pool = self.pool
        if waiting is None:
            waiting = [(max(0, pool.blocks_needed(r.prefill_target)
                            - pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length)), 0)
                       for _, r in zip(range(self.cfg.max_waiting_scan), self.rep.waiting)]
        held = pool.capacity_blocks - pool.num_free_blocks
        return min(1.0, (held + sum(d for d, _ in waiting)) / pool.capacity_blocks)

    def _recompute_s(self, lo: int, n: int) -> float:
        """Prefill time of blocks ``[lo, lo + n)`` of a prompt, were they recomputed."""
        return recompute_s(self.prof, lo * self.bs, n * self.bs)

    def _worth_reload(self, lo: int, n: int) -> bool:
        """The reload test (``temporal.worth_moving``) for blocks ``[lo, lo + n)``."""
        if not self.gated or worth_moving(self._recompute_s(lo, n),
                                          self.host.h2d.duration(n * self.bb), self.cfg.gate):
            return True
        self.gate["reload_low_saving"] += 1
        return False

    def _head_demand(self) -> int:
        w = self.rep.waiting
        if not w:
            return 0
        r = w[0]
        return max(0, self.pool.blocks_needed(r.prefill_target)
                   - self.pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length))

    # -- hooks ----------------------------------------------------------------------------

    def on_arrival(self, req) -> None:
        sid = req.session
        self._sorted = False
        if sid is None:
            return
        st = self.sessions.get(sid)
        now = req.arrival_s
        agent = agent_of(req.ctx)
        if st is None:
            return
        if st.pending:
            st.pending = False
            self._unpin(st)
            if st.tool_stop:
                self.forecast.observe(now - st.end_s, st.tool, st.args)
            if self.mode == "tokencake" and st.agent is not None:
                self.trans.observe(st.agent, agent)
            if (st.offloaded and st.demote and self.cfg.queue_wait
                    and math.isfinite(st.stall_s) and now >= st.offload_done_s):
                # back from the tool: its blocks are used at admission, expected in wait_s
                self._demote(st, now + self.wait_s)
            if st.offloaded and not st.reload_started:
                self._start_reload(st, now)  # the tool returned early: reload at once
        st.agent = agent

    def on_step(self, now: float) -> None:
        self.rep_now = now
        self._turnover_s()
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
        if self.mode == "tokencake" and now >= self._next_spatial:
            self._next_spatial = now + self.cfg.spatial_interval_s
            self._spatial(now)

    def order_waiting(self, now: float) -> None:
        if self.mode != "tokencake" or self._sorted or not self.crit:
            return
        self._sorted = True
        w = self.rep.waiting
        if len(w) < 2:
            return
        crit = self.crit
        boost = self.cfg.spatial.boost_s
        items = sorted(w, key=lambda r: sp.admission_rank(
            r.preemptions > 0, crit.get(agent_of(r.ctx), 0.0), r.arrival_s, boost))
        w.clear()
        w.extend(items)

    def on_admit(self, req, alloc, now: float) -> tuple[int, int, float]:
        """(warm-up blocks hit, blocks reloaded now, when the request may run)."""
        ready = 0.0
        warm = 0
        if req.preemptions == 0:
            self.wait_s = self.cfg.next_wait(self.wait_s, now - req.arrival_s)
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
        if not st.tool_stop or self.mode == "off" or not st.keys:
            return
        n_gpu = self._gpu_run(st.keys)
        if n_gpu == 0:
            return
        host = self.host.keys
        n_new = sum(1 for k in st.keys[:n_gpu] if k not in host)
        if self.mode == "naive":  # a swap-out of the whole context, every stall
            self._offload(st, n_gpu, n_gpu, now, stall_s=math.inf)
            return
        if self.mode == "naive-incremental":
            self._offload(st, n_gpu, n_new, now, stall_s=math.inf)
            return
        stall = self.cfg.idle_s(self.forecast.predict(st.tool, st.args), self.wait_s)
        d2h, h2d = self.host.d2h, self.host.h2d
        pool = self.pool
        waiting = [(max(0, pool.blocks_needed(r.prefill_target)
                        - pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length)),
                    r.prefill_target)
                   for _, r in zip(range(self.cfg.max_waiting_scan), self.rep.waiting)]
        crit = self.crit.get(st.agent, 0.0) if self.mode == "tokencake" else 0.0
        pressure = self._pressure(waiting)
        inp = GateInput(
            stall_s=stall,
            offload_s=max(0.0, d2h.busy_until - now) + d2h.duration(n_new * self.bb),
            reload_s=h2d.duration(n_gpu * self.bb), gpu_usage=pressure,
            host_free_blocks=self.host.capacity_blocks - len(self.pins), offload_blocks=n_new,
            freed_blocks=n_gpu,
            free_blocks=pool.num_free_blocks - pool.num_cached_free_blocks,
            waiting=waiting, tokens_per_s=self.tokens_per_s,
            since_move_s=now - st.last_move_s, criticality=crit,
            recompute_s=self._recompute_s(0, n_gpu))
        dec = decide_offload(inp, self.cfg.gate)
        self.gate[dec.reason] += 1
        act = stall_action(dec, stall, self._survival_s(), self.cfg.gate)
        if act == "offload" or act == "backup":
            self.actions[act] += 1
            self._offload(st, n_gpu, n_new, now, stall_s=stall, reload_s=inp.reload_s,
                          demote=act == "offload")
        elif act == "hold":
            blocks = self._free_blocks(st)
            if blocks:
                self.actions[act] += 1
                self.policy.hold(reversed(blocks), hold_until_s(now, stall, self.cfg.gate))

    # -- transfers ------------------------------------------------------------------------

    def _turnover_s(self) -> float:
        """Measured time for the pool to evict ``capacity`` blocks (EWMA), inf before."""
        ev = self.pool.stats.evictions
        cap = self.pool.capacity_blocks
        now = self.rep_now
        while ev - self._ev_mark >= cap:
            self._ev_mark += cap
            dt = now - self._ev_t
            self._ev_t = now
            self._turn = dt if self._turn == math.inf else 0.7 * self._turn + 0.3 * dt
        return self._turn

    def _survival_s(self) -> float:
        """How long a block freed now stays cached: the cached free blocks ahead of it
        over the eviction rate (capacity / turnover); inf before the first turnover."""
        turn = self._turnover_s()
        if turn == math.inf:
            return math.inf
        return turn * self.pool.num_cached_free_blocks / self.pool.capacity_blocks

    def _offload(self, st: _Session, n_gpu: int, n_new: int, now: float, *,
                 stall_s: float, reload_s: float = 0.0, demote: bool = True) -> None:
        done = self.host.d2h.schedule(now, n_new * self.bb) if n_new else now
        self.offloads += 1
        self.offload_blocks += n_new
        st.offloaded = True
        st.demote = demote
        st.offload_n = n_gpu
        self._unpin(st)
        st.pinned = n_gpu
        pins = self.pins
        for k in st.keys[:n_gpu]:
            pins[k] += 1
        st.offload_done_s = done
        st.last_move_s = now
        st.stall_s = stall_s
        self._seq += 1
        heapq.heappush(self._d2h, (done, self._seq, st))
        if math.isfinite(stall_s):
            at = reload_at_s(st.end_s, stall_s, reload_s, done, self.cfg.gate)
            self._seq += 1
            heapq.heappush(self._due, (at, self._seq, st))

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

    def _unpin(self, st: _Session) -> None:
        pins = self.pins
        for k in st.keys[:st.pinned]:
            if pins[k] <= 1:
                del pins[k]
            else:
                pins[k] -= 1
        st.pinned = 0

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
        need = n_host
        if need > pool.num_free_blocks - self._head_demand():
            self.gate["reload_no_room"] += 1
            return
        ctx = RequestContext(request_id=("reload", st.sid, self._seq), keys=keys[:hi],
                             input_length=hi * self.bs + 1, now_s=now, session_id=st.sid,
                             agent_hint=st.agent if isinstance(st.agent, str) else None,
                             warmup=True)
        self._seq += 1
        alloc = pool.allocate(ctx, hi * self.bs)
        if alloc is None:
            self.gate["reload_no_room"] += 1
            return
        # the blocks are keyed now and their data lands at reload_done_s; they are
        # released at once (cached, free): holding them until the request is admitted
        # can deadlock a full pool whose queue head needs them
        pool.free(alloc)
        pool.sim_free_epoch += 1
        st.reload_lo, st.reload_hi = alloc.hit_blocks, hi
        st.reload_done_s = self.host.h2d.schedule(now, n_host * self.bb)
        st.last_move_s = now
        self.reloads += 1
        self.reload_blocks += n_host

    # -- spatial --------------------------------------------------------------------------

    def _spatial(self, now: float) -> None:
        rep = self.rep
        usage: Counter = Counter()
        queue: Counter = Counter()
        active: Counter = Counter()
        for r in rep.running:
            a = agent_of(r.ctx)
            if r.alloc is not None:
                usage[a] += len(r.alloc.blocks)
            active[a] += 1
        for r in rep.waiting:
            a = agent_of(r.ctx)
            queue[a] += 1
            active[a] += 1
        for st in self.sessions.values():
            if st.pending:
                active[st.agent] += 1
        agents = set(usage) | set(queue) | set(active)
        if not agents:
            return
        flow = sp.transition_flow(self.trans, agents)
        scores = sp.agent_scores(flow, queue, usage, active, self.cfg.weights)
        self.crit = sp.criticality(scores)
        self._sorted = False
        p = self.cfg.spatial
        total = int(sp.reserved_fraction(self._pressure(), p) * self.pool.capacity_blocks)
        shares = sp.split_reservation(total, sp.critical_agents(scores, p), usage, scores, p)
        self.policy.set_reservation(shares, now)
        self.spatial_updates += 1
        for a, n in shares.items():
            self.reserved_sum[a] += n
            self.reserved_max[a] = max(self.reserved_max[a], n)

    # -- report ---------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        return {
            "offloads": self.offloads, "offload_blocks": self.offload_blocks,
            "reloads": self.reloads, "reload_blocks": self.reload_blocks,
            "demand_reloads": self.demand_reloads,
            "offload_bytes": self.host.d2h.bytes, "reload_bytes": self.host.h2d.bytes,
            "outcomes": dict(self.outcomes), "gate": dict(self.gate),
            "demoted_evictions": self.policy.demoted_evictions,
            "actions": dict(self.actions), "held_evictions": self.policy.held_evictions,
            "protected_evictions": self.policy.protected_evictions,
        }


def _merge(dicts: Sequence[dict]) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = dict(Counter(out.get(k, {})) + Counter(v))
            else:
                out[k] = out.get(k, 0) + v
    return out


def run_tiered(records, contexts, cfg, policy: str, router: str = "session", *,
               tiering: TieringConfig | None = None,
               policy_params: dict[str, Any] | None = None,
               router_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """``run_timed`` with a host tier and a tiering mode on every replica."""
    from anchorage.sim.cluster import (
        POOLED,
        measured_requests,
        run_timed,
        simulate_timed,
    )

    tiering = tiering or TieringConfig()
    if tiering.mode == "off":
        out = run_timed(records, contexts, cfg, policy, router, policy_params=policy_params,
                        router_params=router_params)
        out["tiering"] = {"mode": "off"}
        return out
    if router == POOLED:
        raise ValueError("tiering needs one pool per replica (not the pooled router)")
    tool_stop = [r.tool_name is not None or r.tool_duration_ms is not None for r in records]
    ctl: list[SimTiering] = []

    def attach(sim) -> None:
        for rep in sim.replicas:
            rep.tiering = SimTiering(rep, tiering, tool_stop)
            ctl.append(rep.tiering)

    sim, out = simulate_timed(records, contexts, cfg, policy, router,
                              policy_params=policy_params, router_params=router_params,
                              wrap_policy=lambda p: TieredEviction(p, agent_of),
                              prepare=attach)
    done, _ = measured_requests(sim)
    host_blocks = sum(r.host_hit_blocks for r in done)
    out["host_hit_blocks"] = host_blocks
    out["host_hit_rate"] = host_blocks / out["prompt_blocks"] if out["prompt_blocks"] else 0.0
    out["host_hit_tokens"] = sum(r.host_hit_tokens for r in done)
    tot = _merge([c.counters() for c in ctl])
    tot["bytes_moved"] = tot["offload_bytes"] + tot["reload_bytes"]
    out.update(tot)
    n_upd = sum(c.spatial_updates for c in ctl)
    res_sum: Counter = Counter()
    res_max: Counter = Counter()
    for c in ctl:
        res_sum.update(c.reserved_sum)
        for a, v in c.reserved_max.items():
            res_max[a] = max(res_max[a], v)
    out["reserved_blocks"] = {str(a): {"mean": res_sum[a] / n_upd if n_upd else 0.0,
                                       "max": res_max[a]} for a in res_sum}
    h = tiering.host
    out["tiering"] = {
        "mode": tiering.mode, "host_capacity_bytes": h.capacity_bytes,
        "d2h_bytes_s": h.d2h_bytes_s, "h2d_bytes_s": h.h2d_bytes_s,
        "block_bytes": ctl[0].bb if ctl else None,
        "watermark": tiering.gate.watermark,
    }
    return out
