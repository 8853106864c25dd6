"""One simulated vLLM replica: its block pool and its continuous-batching scheduler.

Specification (vLLM v1's scheduler, simplified where noted)
------------------------------------------------------------
A replica holds a ``BlockPool`` (``anchorage.pool.block_pool``) and two queues, ``running``
and ``waiting`` (FCFS). Each engine step is planned by ``plan_step(now)``:

1. Running requests first, in order, with a token budget ``max_num_batched_tokens``: a
   request still prefilling gets ``min(remaining prefill, budget)`` tokens (chunked
   prefill), a decoding one gets 1 token. With ``long_prefill_tokens = L > 0`` (vLLM's
   ``long_prefill_token_threshold``) a prefill chunk is at most ``L`` tokens, running or
   newly admitted, in every step that starts with more than one request running or
   waiting (vLLM: a request alone has nobody to starve); default 0, no cap. A decode
   needs room for its next token (``BlockPool.grow``); when the pool is out of blocks the
   *last* running request is preempted (vLLM's recompute preemption: its blocks are freed,
   its progress dropped, it goes back to the head of ``waiting`` and later re-prefills its
   prompt plus the tokens it had generated), until the request fits or was itself
   preempted.
2. If nothing was preempted, waiting requests are admitted in order while the budget
   lasts and ``len(running) < max_num_seqs``: ``BlockPool.allocate`` looks up the prefix
   hit, touches the hit blocks and allocates (and caches) blocks for the whole prompt at
   admission (vLLM allocates per scheduled chunk: a simplification that reserves memory a
   little earlier). Admission stops at the first request that does not fit (no
   head-of-line skipping, as in vLLM).
   With ``admission = "prefix-aware"`` the waiting queue is first put in
   ``anchorage.policies.admission.admission_order`` (fewest new blocks first, aged by
   waiting time, with the TTFT target of ``admission_params``; the order
   ``ANCHORAGE_SCHEDULER=prefix-aware`` gives vLLM), with preempted requests kept ahead of
   the rest in their order; it is re-sorted when a request arrived or blocks were released
   since the last sort, or a waiting request changed class. Default ``"fcfs"``.

A request is announced to the pool's policy when it is queued (``on_queued``, at its
arrival time), before admission touches anything.

The step's duration comes from ``anchorage.sim.costmodel.step_time_s``. When it ends
(``finish_step``), prefilling requests advance by their chunk; a request whose prefill is
complete samples a token (its first token: TTFT), decoding requests sample one token each;
blocks filled by generated tokens are cached under fresh keys; a request that has all
``max(1, output_length)`` tokens frees its blocks. The policy clock (``ctx.now_s``) is the
simulated time of each pool operation.

Counters per admission: ``prefill_tokens`` (prompt plus resumed output) = ``hit_tokens``
(prefix-cache hits) + ``host_hit_tokens`` (served from the host tier) + ``computed_tokens``
(prefilled, i.e. recomputed).

Host tier (optional, ``anchorage.tiering.sim``): a replica with ``tiering`` set calls its
hooks: ``on_arrival`` (a request is queued), ``on_step`` (each step plan: due transfers),
``order_waiting`` (admission priority, when the tier ``orders_waiting``: the spatial
reservation's; otherwise the replica's ``admission`` order applies), ``on_admit`` (blocks reloaded ahead of time count
as host hits; the prompt's continuation held in host memory is reloaded before use: the
request holds its blocks but is not scheduled until ``ready_s``) and ``on_turn_end``
(a request completed: the offload decision). When every running request waits for a
reload and nothing else can run, the step is an idle wait until the first is ready. A load
that ``anchorage.tiering.loads.sync_load`` takes synchronously (its transfer, from the
admission to ``ready_s``, with the step's earlier synchronous loads; the tier's
``cfg.sync_load_max_s``) is waited for by the step that admits the request: the request is
scheduled in it and the step's duration grows by the longest such wait.
Without ``tiering`` the replica behaves exactly as before.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from anchorage.policies.admission import AdmissionParams
from anchorage.policies.base import RequestContext
from anchorage.pool.block_pool import Allocation, BlockPool
from anchorage.sim import queues, span
from anchorage.sim.costmodel import step_time_s
from anchorage.sim.profiles import HardwareProfile
from anchorage.tiering.loads import sync_load


class SimRequest:
    """One request's life in the simulator (plain data)."""

    __slots__ = ("ctx", "arrival_s", "session", "next_gap_s", "measured", "prompt_len",
                 "output_len", "num_computed", "num_output", "prefill_target", "alloc",
                 "first_token_s", "finish_s", "hit_tokens", "computed_tokens",
                 "prefill_tokens", "hit_blocks", "preemptions", "replica", "admitted_s",
                 "index", "host_hit_tokens", "host_hit_blocks", "ready_s", "tool")

    def __init__(self, ctx: RequestContext, arrival_s: float, *, session: Any = None,
                 next_gap_s: float | None = None, measured: bool = True, index: int = 0):
        self.ctx = ctx
        self.arrival_s = arrival_s
        self.session = session
        self.next_gap_s = next_gap_s
        self.measured = measured
        self.index = index
        self.prompt_len = ctx.input_length
        self.output_len = max(1, ctx.output_length)
        self.num_computed = 0
        self.num_output = 0
        self.prefill_target = ctx.input_length
        self.alloc: Allocation | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.hit_tokens = 0
        self.computed_tokens = 0
        self.prefill_tokens = 0
        self.hit_blocks = 0
        self.preemptions = 0
        self.replica = -1
        self.admitted_s: float | None = None
        self.host_hit_tokens = 0
        self.host_hit_blocks = 0
        self.ready_s = 0.0  # waits for a host-tier reload until then
        self.tool = ctx.tool_name  # the tool call it ends in, known at completion


@dataclass
class StepPlan:
    start_s: float
    duration_s: float
    # (request, new tokens, was prefilling)
    items: list[tuple[SimRequest, int, bool]] = field(default_factory=list)
    steps: int = 1                     # > 1: a decode span (anchorage.sim.span)
    ends: list[float] = field(default_factory=list)  # a span's step end times


@dataclass
class ReplicaStats:
    admissions: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    prefill_tokens: int = 0
    hit_tokens: int = 0
    computed_tokens: int = 0
    decode_tokens: int = 0
    preemptions: int = 0
    steps: int = 0
    busy_s: float = 0.0
    completed: int = 0
    rejected: int = 0
    host_hit_blocks: int = 0
    host_hit_tokens: int = 0


def can_allocate(pool: BlockPool, ctx: RequestContext, num_tokens: int) -> bool:
    """``BlockPool.allocate`` would succeed (same arithmetic, no side effects)."""
    hit = pool.num_hit_blocks(ctx.keys, ctx.input_length)
    need = pool.blocks_needed(num_tokens) - hit
    free = pool.num_free_blocks
    if need > free:
        return False
    if need <= free - hit:  # fits even if every hit block is currently evictable
        return True
    ref, get = pool.ref_cnt, pool.get_cached_block
    evictable_hits = 0
    for k in ctx.keys[:hit]:
        if ref[get(k)] == 0:
            evictable_hits += 1
    return need <= free - evictable_hits


ADMISSIONS = ("fcfs", "prefix-aware", "program-fcfs")


class Replica:
    """A replica's scheduler over a pool (the pool may be shared: the ``pooled`` mode)."""

    def __init__(self, index: int, profile: HardwareProfile, pool: BlockPool,
                 cost: Callable[..., float] = step_time_s, admission: str = "fcfs",
                 admission_params: AdmissionParams | None = None,
                 long_prefill_tokens: int = 0):
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, "
                             f"got {admission!r}")
        if long_prefill_tokens < 0:
            raise ValueError(f"long_prefill_tokens must be >= 0, got {long_prefill_tokens}")
        self.admission = admission
        self.admission_params = admission_params or AdmissionParams()
        self.long_prefill_tokens = long_prefill_tokens
        self._chunk_cap = 0   # this step's cap on a prefill chunk (0: none; plan_step)
        self._sorted_at: tuple[int, int] | None = None  # (arrivals, free epoch) of last sort
        self._resort_at = math.inf   # when a waiting request next changes class (queues)
        self._arrivals = 0
        self.index = index
        self.profile = profile
        self.pool = pool
        self.cost = cost
        self.bs = pool.block_size
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.busy = False
        self.stats = ReplicaStats()
        self._blocked: tuple[SimRequest, int] | None = None  # (head, pool free epoch)
        self._sync_wait_s = 0.0   # this step's synchronous host loads (anchorage.tiering.loads)
        self.tiering: Any = None  # anchorage.tiering.sim.SimTiering, optional
        self.spans = False        # plan pure-decode steps as spans (anchorage.sim.span)
        self.retention: Any = None  # anchorage.sim.retention.ContinuumPins, optional
        self._program_start: dict[Any, float] = {}  # session -> first arrival here
        if not hasattr(pool, "sim_free_epoch"):
            pool.sim_free_epoch = 0  # counts releases: a blocked head can fit only after one

    # -- queue ------------------------------------------------------------------------------

    def fits_ever(self, req: SimRequest) -> bool:
        total = req.prompt_len + req.output_len - 1
        return self.pool.blocks_needed(max(total, req.prompt_len)) <= self.pool.capacity_blocks

    def enqueue(self, req: SimRequest) -> None:
        req.replica = self.index
        self._arrivals += 1
        self.waiting.append(req)
        req.ctx.now_s = req.arrival_s
        if req.session is not None and req.session not in self._program_start:
            self._program_start[req.session] = req.arrival_s
        if self.retention is not None:
            self.retention.on_arrival(req.session, req.arrival_s)
        self.pool.policy.on_queued(req.ctx)
        if self.tiering is not None:
            self.tiering.on_arrival(req)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- one step ---------------------------------------------------------------------------

    def _preempt(self, req: SimRequest, now: float) -> None:
        req.ctx.now_s = now
        self.pool.free(req.alloc)
        self.pool.sim_free_epoch += 1
        req.alloc = None
        req.num_computed = 0
        req.prefill_target = req.prompt_len + req.num_output
        req.preemptions += 1
        req.ready_s = 0.0
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def plan_step(self, now: float) -> StepPlan | None:
        """Choose this step's work (mutates queues and the pool); None when idle: the
        running requests first (``_schedule_running``: a chunk of prefill or one decode
        token each, preempting when the pool is full), then, unless something was
        preempted, waiting requests admitted in queue order (``_admit_waiting``)."""
        p = self.profile
        items: list[tuple[SimRequest, int, bool]] = []
        tier = self.tiering
        self._sync_wait_s = 0.0
        if tier is not None:
            tier.on_step(now)
        if self.retention is not None and self.retention.pins:
            self._release_pins(now)
        lp = self.long_prefill_tokens
        self._chunk_cap = lp if lp and len(self.running) + len(self.waiting) > 1 else 0
        budget, preempted = self._schedule_running(now, p.max_num_batched_tokens, items)
        stalled = False
        if not preempted:
            budget, stalled = self._admit_waiting(now, budget, items)
        if not items:
            if tier is not None:
                ready = [r.ready_s for r in self.running if r.ready_s > now]
                if ready:  # idle until the first reload completes
                    return StepPlan(start_s=now, duration_s=min(ready) - now)
            return None
        prefill = [(n, r.num_computed) for r, n, pf in items if pf]
        decode = [r.num_computed for r, n, pf in items if not pf]
        dur = self.cost(p, prefill, decode) + self._sync_wait_s
        plan = StepPlan(start_s=now, duration_s=dur, items=items)
        if self.spans and not prefill and span.spannable(self, plan, stalled):
            horizon = tier.next_due_s() if tier is not None else float("inf")
            if self.retention is not None:
                horizon = min(horizon, self.retention.next_expiry_s())
            plan = span.extend(self, plan, now, horizon)
        return plan

    def _schedule_running(self, now: float, budget: int, items: list) -> tuple[int, bool]:
        """The running requests' work for this step, in order, within ``budget`` tokens;
        a request whose blocks do not fit releases a pin or preempts (``queues.victim``).
        Returns the budget left and whether anything was preempted."""
        running, bs = self.running, self.bs
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            if r.ready_s > now:  # its blocks are still coming back from host memory
                i += 1
                continue
            prefilling = r.num_computed < r.prefill_target
            n = self._chunk(r, budget) if prefilling else 1
            fits = True
            while (r.num_computed + n > len(r.alloc.blocks) * bs
                   and not self.pool.grow(r.alloc, r.num_computed + n)):
                if self.retention is not None and self.retention.pins:
                    self._unpin(self.retention.latest())  # a pin goes before a request
                    self.retention.released_early += 1
                    continue
                victim = queues.victim(self, i)
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    fits = False
                    break
            if not fits:
                break
            items.append((r, n, prefilling))
            budget -= n
            i += 1
        return budget, preempted

    def _chunk(self, r: SimRequest, budget: int) -> int:
        """A prefilling request's tokens this step: what is left of its prefill, within the
        budget and this step's chunk cap (``long_prefill_tokens``)."""
        n = r.prefill_target - r.num_computed
        cap = self._chunk_cap
        if 0 < cap < n:
            n = cap
        return min(n, budget)

    def _admit_waiting(self, now: float, budget: int, items: list) -> tuple[int, bool]:
        """Admit waiting requests in queue order (the tier's, prefix-aware or program FCFS
        order first) while budget, sequence slots and blocks allow. Returns the budget left
        and whether the queue head is stalled (it does not fit, or no slot is free)."""
        p, waiting, pool, running = self.profile, self.waiting, self.pool, self.running
        tier = self.tiering
        stalled = False
        if tier is not None and tier.orders_waiting:
            if waiting:
                tier.order_waiting(now)
        elif self.admission == "prefix-aware" and len(waiting) > 1:
            queues.order_prefix_aware(self, now)
        elif self.admission == "program-fcfs" and len(waiting) > 1:
            queues.order_program_fcfs(self)
        while waiting and budget > 0 and len(running) < p.max_num_seqs:
            r = waiting[0]
            ctx = r.ctx
            blocked = self._blocked
            if blocked is not None and blocked[0] is r and blocked[1] == pool.sim_free_epoch:
                stalled = True
                break  # nothing was released since it last did not fit
            if not can_allocate(pool, ctx, r.prefill_target):
                ret = self.retention
                if ret is not None and ret.pins and ret.p.yield_to_waiting:
                    self._unpin(ret.latest())  # a stalled agent's KV yields to new work
                    ret.released_early += 1
                    continue
                self._blocked = (r, pool.sim_free_epoch)
                stalled = True
                break
            ctx.now_s = now
            alloc = pool.allocate(ctx, r.prefill_target)
            waiting.popleft()
            self._admitted(r, alloc, now)
            running.append(r)
            if r.ready_s > now:
                continue  # scheduled once its reload completes
            n = self._chunk(r, budget)
            items.append((r, n, True))
            budget -= n
        if waiting and len(running) >= p.max_num_seqs:
            stalled = True
        return budget, stalled

    def _admitted(self, r: SimRequest, alloc, now: float) -> None:
        """A request got its blocks: GPU and host hits (the tier's loads), computed
        tokens, and the replica's counters."""
        bs, tier = self.bs, self.tiering
        r.alloc = alloc
        gpu_hit = alloc.hit_blocks
        host_hit = 0
        reused = gpu_hit  # blocks not prefilled
        if tier is not None:
            warm, host, ready = tier.on_admit(r, alloc, now)
            gpu_hit -= warm  # reloaded ahead of time: served from host
            host_hit = warm + host
            reused += host
            wait = self._sync_wait_s
            if ready > now and sync_load(max(0.0, ready - now - wait), wait,
                                         tier.cfg.sync_load_max_s):
                self._sync_wait_s = max(wait, ready - now)  # this step waits for the copy
                ready = now
            r.ready_s = ready
            r.host_hit_blocks += host_hit
            r.host_hit_tokens += host_hit * bs
        hit_t = gpu_hit * bs
        r.num_computed = reused * bs
        r.prefill_tokens += r.prefill_target
        r.hit_tokens += hit_t
        r.hit_blocks += gpu_hit
        if r.admitted_s is None:
            r.admitted_s = now
        st = self.stats
        st.admissions += 1
        if r.measured:
            st.prompt_blocks += len(r.ctx.keys)
            st.hit_blocks += gpu_hit
            st.prefill_tokens += r.prefill_target
            st.hit_tokens += hit_t
            st.host_hit_blocks += host_hit
            st.host_hit_tokens += host_hit * bs

    def _unpin(self, session) -> None:
        alloc, _ = self.retention.pins.pop(session)
        self.pool.free(alloc)
        self.pool.sim_free_epoch += 1

    def _release_pins(self, now: float) -> None:
        if self.retention.next_expiry_s() > now:
            return  # nothing expired: skip the O(queue) set (long queues made runs crawl)
        waiting = {r.session for r in self.waiting}
        for s in self.retention.expired(now, waiting):
            self._unpin(s)

    def next_wake_s(self) -> float:
        """When this replica must plan again even with nothing running (a pin expires)."""
        return self.retention.next_expiry_s() if self.retention is not None else float("inf")

    def finish_step(self, plan: StepPlan) -> list[SimRequest]:
        """Apply a finished step; returns the requests that completed (blocks freed)."""
        end = plan.start_s + plan.duration_s
        st = self.stats
        if not plan.items:
            return []  # an idle wait for a reload
        k = plan.steps
        st.steps += k
        st.busy_s += plan.duration_s
        done: list[SimRequest] = []
        bs = self.bs
        pool = self.pool
        for r, n, prefilling in plan.items:
            if k > 1:
                n = k  # a decode span: one token per step
            r.num_computed += n
            if prefilling:
                r.computed_tokens += n
                if r.measured:
                    st.computed_tokens += n
                if r.num_computed < r.prefill_target:
                    continue  # more chunks to go
                if r.first_token_s is None:
                    r.first_token_s = end
            else:
                st.decode_tokens += n
            r.num_output += 1 if prefilling else n
            if r.num_computed // bs > r.alloc.num_cached:
                pool.cache_generated_blocks(r.alloc, r.num_computed)
            if r.num_output >= r.output_len:
                done.append(r)
        if done:
            gone = set(id(r) for r in done)
            self.running = [r for r in self.running if id(r) not in gone]
            ret = self.retention
            for r in done:
                r.ctx.now_s = end
                r.finish_s = end
                until = ret.on_complete(r.session, r.tool, end) if ret is not None else 0.0
                if until > 0:
                    if r.session in ret.pins:
                        self._unpin(r.session)
                    ret.pins[r.session] = (r.alloc, until)
                    ret.pinned += 1
                else:
                    pool.free(r.alloc)
                    pool.sim_free_epoch += 1
                r.alloc = None
                st.completed += 1
                if self.tiering is not None:
                    self.tiering.on_turn_end(r, end)
        return done
