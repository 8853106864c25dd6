"""Discrete-event cluster simulation: R replicas behind a router, open- or closed-loop.

Specification
-------------
Events live in one heap ordered by ``(time, sequence number)``, so a run is deterministic.
Two kinds: a request *arrives* (the router picks a replica, which queues it and starts a
step if idle) and a replica's *step ends* (``Replica.finish_step``; completed requests
notify the router and, closed-loop, schedule their session's next request; the replica
plans its next step at once if it has work).

Arrivals (``Workload``):

- ``open``: every request arrives at its trace timestamp (times ``time_scale``).
- ``closed``: a session's first request arrives at its timestamp (times ``time_scale``);
  each later one arrives when the previous one completed plus a gap: the previous
  record's ``tool_duration_ms`` when it made a tool call, else ``think_s``. Requests
  without a session arrive open-loop.
- ``closed`` with ``max_sessions = N``: a closed system of N session slots. Sessions (and
  session-less requests) start in timestamp order, each at ``max(its timestamp, the time
  a slot frees)``; a slot frees when a session's last request completes. Metrics cover
  the steady state: requests arriving inside ``window`` = (``max(warmup_s, warmup_frac x
  last session start)``, the last session start), and throughput counts turns completed
  inside that window.

Warm-up: requests flagged ``warmup`` (``extra.warmup`` in the trace) or arriving before
``warmup_s`` run normally but are left out of every reported metric; flagged ones also
carry ``ctx.warmup`` so policies do not learn from them.

Routers: ``Router`` objects from ``anchorage.routing`` see a ``ReplicaView`` per replica
(running, waiting, queued prefill tokens, KV usage, capacity, the prefill rate of the
profile's cost model for a 2,048-token chunk; ``extra["anchors"]`` when the
replica's policy's ``anchor_labels()`` returns any) and are told ``on_start``/``on_finish``; routers
that consume KV events get ``BlockStored``/``BlockRemoved`` from the replica's pool. The
``pooled`` mode is the placement reference: R schedulers share one pool of R times the
capacity (a perfectly shared cache), and requests go to the least-loaded scheduler.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Sequence

from anchorage.policies.admission import AdmissionParams
from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.routing.base import ReplicaView, Router
from anchorage.sim import span
from anchorage.sim.engine import ADMISSIONS, Replica, SimRequest
from anchorage.sim.programs import PROGRAM_GATES, make_gate
from anchorage.sim.retention import ContinuumPins, PinParams
from anchorage.sim.costmodel import step_time_s
from anchorage.sim.profiles import HardwareProfile
from anchorage.sim.report import measured_requests, summarize  # noqa: F401 (re-exported)
from anchorage.sim.workload import Workload, build_workload  # noqa: F401 (re-exported)
from anchorage.trace.format import TraceRecord


def prefill_tokens_per_s(profile: HardwareProfile, chunk: int = 2048) -> float:
    """The prefill rate a replica of ``profile`` shows a router: a ``chunk``-token prefill
    with no context, in tokens per second of its cost model."""
    t = step_time_s(profile, [(chunk, 0)])
    return chunk / t if t > 0 else 0.0

POOLED = "pooled"


@dataclass
class TimedConfig:
    profile: HardwareProfile
    replicas: int = 1
    mode: str = "closed"          # "open" | "closed"
    time_scale: float = 1.0       # multiplies trace timestamps (0.5 = twice the rate)
    think_s: float = 0.3          # closed-loop gap after a turn without a tool call
    warmup_s: float = 0.0
    capacity_blocks: int | None = None  # per replica; default: the profile's
    max_sessions: int | None = None     # closed loop: concurrent session slots
    warmup_frac: float = 0.0            # with max_sessions: also skip this part of the window
    admission: str = "fcfs"             # replica admission order: "fcfs" | "prefix-aware"
    admission_params: dict | None = None  # prefix-aware: anchorage.policies.admission
    long_prefill_tokens: int = 0        # prefill chunk cap (vLLM long_prefill_token_threshold)
    decode_spans: bool = True           # simulate pure-decode steps as spans (sim.span)
    program_gate: str = "none"          # "none" | "thunderagent" (anchorage.sim.programs)
    program_gate_params: dict | None = None
    retention: str = "none"             # "none" | "continuum" (anchorage.sim.retention)
    retention_params: dict | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError("replicas must be >= 1")
        if self.mode not in ("open", "closed"):
            raise ValueError(f"mode must be 'open' or 'closed', got {self.mode!r}")
        if not self.time_scale > 0:
            raise ValueError("time_scale must be > 0")
        if not 0 <= self.warmup_frac < 1:
            raise ValueError("warmup_frac must be in [0, 1)")
        if self.think_s < 0 or self.warmup_s < 0:
            raise ValueError("think_s and warmup_s must be >= 0")
        if self.capacity_blocks is not None and self.capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        if self.long_prefill_tokens < 0:
            raise ValueError(f"long_prefill_tokens must be >= 0, got {self.long_prefill_tokens}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {', '.join(ADMISSIONS)}, "
                             f"got {self.admission!r}")
        self.admission_order_params = AdmissionParams.from_dict(self.admission_params or {})
        if self.program_gate not in PROGRAM_GATES:
            raise ValueError(f"program_gate must be one of {', '.join(PROGRAM_GATES)}, "
                             f"got {self.program_gate!r}")
        if self.retention not in ("none", "continuum"):
            raise ValueError(f"retention must be 'none' or 'continuum', got {self.retention!r}")
        if self.max_sessions is not None and (self.max_sessions < 1 or self.mode != "closed"):
            raise ValueError("max_sessions must be >= 1 and needs closed-loop arrivals")

    @property
    def capacity(self) -> int:
        return self.capacity_blocks or self.profile.capacity_blocks


class EventPool(BlockPool):
    """A block pool that records KV events (``anchorage.routing.events``) for a router."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list = []

    def cache_full_blocks(self, alloc, num_full, keys=None):
        before = len(alloc.keys)
        super().cache_full_blocks(alloc, num_full, keys)
        if len(alloc.keys) > before:
            from anchorage.routing.events import BlockStored
            parent = alloc.keys[before - 1] if before else None
            self.events.append(BlockStored(keys=list(alloc.keys[before:]), parent=parent))

    def _evict(self, b):
        k = self.block_key[b]
        super()._evict(b)
        if k not in self.cached:
            from anchorage.routing.events import BlockRemoved
            self.events.append(BlockRemoved(keys=[k]))


def queued_prefill_tokens(rep: Replica) -> int:
    """Prefill tokens queued on ``rep``: waiting prompts (whole: their cache hits are known
    only at admission) plus what running requests still have to prefill."""
    n = 0
    for q in rep.waiting:
        n += q.prefill_target - q.num_computed
    for q in rep.running:
        if q.num_computed < q.prefill_target:
            n += q.prefill_target - q.num_computed
    return n


def _uses_kv_events(router: Router | None) -> bool:
    return router is not None and type(router).on_kv_event is not Router.on_kv_event


def _uses_first_token(router: Router | None) -> bool:
    return router is not None and type(router).on_first_token is not Router.on_first_token


# ---------------------------------------------------------------------------------------
# The event loop

_ARRIVE, _STEP_END, _WAKE, _TICK = 0, 1, 2, 3


class ClusterSim:
    def __init__(self, cfg: TimedConfig, policy_factory, router: Router | None,
                 pooled: bool = False):
        self.cfg = cfg
        self.pooled = pooled
        self.router = None if pooled else router
        cap = cfg.capacity
        events = _uses_kv_events(self.router)
        pool_cls = EventPool if events else BlockPool
        bs = cfg.profile.block_size
        if pooled:
            shared = pool_cls(cap * cfg.replicas, bs, policy_factory())
            self.pools = [shared]
            self.replicas = [Replica(i, cfg.profile, shared, admission=cfg.admission,
                                     admission_params=cfg.admission_order_params,
                                     long_prefill_tokens=cfg.long_prefill_tokens)
                             for i in range(cfg.replicas)]
        else:
            self.pools = [pool_cls(cap, bs, policy_factory()) for _ in range(cfg.replicas)]
            self.replicas = [Replica(i, cfg.profile, p, admission=cfg.admission,
                                     admission_params=cfg.admission_order_params,
                                     long_prefill_tokens=cfg.long_prefill_tokens)
                             for i, p in enumerate(self.pools)]
        if not pooled and cfg.decode_spans:
            for rep in self.replicas:
                rep.spans = True
        if cfg.retention == "continuum":
            if pooled:
                raise ValueError("retention needs one pool per replica (not the pooled router)")
            for rep in self.replicas:
                rep.retention = ContinuumPins(PinParams(**(cfg.retention_params or {})))
        self.gate = None if pooled else make_gate(cfg.program_gate, self.replicas,
                                                   cfg.program_gate_params)
        if self.gate is not None:
            self.router = None  # the gate places programs itself
        rate = prefill_tokens_per_s(cfg.profile)
        self.views = [ReplicaView(index=i, name=f"replica{i}", capacity_blocks=cap,
                                  prefill_tokens_per_s=rate,
                                  extra={"max_load": cfg.profile.max_num_seqs})
                      for i in range(cfg.replicas)]
        self._first_token = _uses_first_token(self.router)
        self._heap: list = []
        self._seq = 0
        self.now = 0.0
        self.completed: list[SimRequest] = []
        self.rejected: list[SimRequest] = []
        self._plans: list[Any] = [None] * cfg.replicas
        self._pending: list[int] = []   # session starts waiting for a slot (reversed)
        self.last_start_s = 0.0

    def _push(self, t: float, kind: int, obj: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, obj))

    def _pick(self, req: SimRequest) -> int:
        if self.pooled:
            return min(range(len(self.replicas)),
                       key=lambda i: (len(self.replicas[i].running) + len(self.replicas[i].waiting), i))
        for v, r in zip(self.views, self.replicas):
            v.running = len(r.running)
            v.waiting = len(r.waiting)
            v.kv_usage = r.pool.usage
            v.queued_tokens = queued_prefill_tokens(r)
            labels = r.pool.policy.anchor_labels()
            if labels is not None:  # policy state the `agent` router reads
                v.extra["anchors"] = labels
        req.ctx.now_s = self.now
        return self.router.pick(req.ctx, self.views)

    def _start(self, rep: Replica) -> None:
        plan = rep.plan_step(self.now)
        self._flush_events(rep)
        if plan is None:
            rep.busy = False
            return
        rep.busy = True
        self._plans[rep.index] = plan
        self._push(self.now + plan.duration_s, _STEP_END, (rep.index, plan))

    def _wake_later(self, rep: Replica) -> None:
        """An idle replica with pinned KV plans again when the first pin expires."""
        if not rep.busy and rep.retention is not None and rep.retention.pins:
            self._push(max(self.now, rep.next_wake_s()), _WAKE, rep.index)

    def _cut_span(self, rep: Replica, t: float) -> None:
        """An arrival at ``t`` ends ``rep``'s decode span at the next step end."""
        plan = self._plans[rep.index]
        if plan is not None and plan.steps > 1 and span.truncate(plan, t):
            self._push(plan.start_s + plan.duration_s, _STEP_END, (rep.index, plan))

    def _flush_events(self, rep: Replica) -> None:
        pool = rep.pool
        if self.router is not None and isinstance(pool, EventPool) and pool.events:
            for ev in pool.events:
                self.router.on_kv_event(rep.index, ev)
            pool.events.clear()

    def run(self, workload: Workload) -> None:
        reqs = workload.requests
        first = workload.first
        slots = self.cfg.max_sessions
        if slots is not None:
            self._pending = list(reversed(first[slots:]))
            first = first[:slots]
        for i in first:
            self._push(reqs[i].arrival_s, _ARRIVE, i)
            self.last_start_s = max(self.last_start_s, reqs[i].arrival_s)
        if self.gate is not None:
            self._push(self.gate.interval_s, _TICK, None)
        self._following = workload.following
        self._reqs = reqs
        while self._heap:
            t, _, kind, obj = heapq.heappop(self._heap)
            self.now = t
            if kind == _ARRIVE:
                req = reqs[obj]
                req.arrival_s = t
                if self.gate is not None:
                    pos = self.gate.route(req, t)
                    if pos is None:
                        continue  # paused: the gate releases it at a check
                else:
                    pos = self._pick(req)
                self._dispatch(req, self.replicas[pos], t)
            elif kind == _STEP_END:
                self._step_end(obj, t)
            elif kind == _WAKE:
                rep = self.replicas[obj]
                if not rep.busy:
                    self._start(rep)
                    self._wake_later(rep)
            else:  # _TICK: the program gate's periodic check
                for req, pos in self.gate.check(t):
                    self._dispatch(req, self.replicas[pos], t)
                if self._heap or self.gate.busy:
                    self._push(t + self.gate.interval_s, _TICK, None)

    def _dispatch(self, req: SimRequest, rep: Replica, t: float) -> None:
        if not rep.fits_ever(req):
            rep.stats.rejected += 1
            req.ctx.now_s = t
            self.rejected.append(req)
            self._session_next(req, self._following, self._reqs, t)
            return
        if self.router is not None:
            self.router.on_start(req.ctx, rep.index)
        if rep.busy:
            self._cut_span(rep, t)
        rep.enqueue(req)
        if not rep.busy:
            self._start(rep)
            self._wake_later(rep)

    def _step_end(self, obj, t: float) -> None:
        i, plan = obj
        if self._plans[i] is not plan or t != plan.start_s + plan.duration_s:
            return  # a span that an arrival cut short: its old end
        rep = self.replicas[i]
        self._plans[i] = None
        done = rep.finish_step(plan)
        if self._first_token:
            for r, _, prefilling in plan.items:
                if prefilling and r.first_token_s == t:
                    self.router.on_first_token(r.ctx, rep.index)
        self._flush_events(rep)
        for r in done:
            self.completed.append(r)
            if self.router is not None:
                self.router.on_finish(r.ctx, rep.index)
            if self.gate is not None:
                self.gate.completed(r, t)
            self._session_next(r, self._following, self._reqs, t)
        self._start(rep)
        self._wake_later(rep)
        if self.pooled and done:  # freed shared blocks may unblock idle schedulers
            for other in self.replicas:
                if not other.busy and other.has_work:
                    self._start(other)

    def _session_next(self, req: SimRequest, following, reqs, t: float) -> None:
        nxt = following.get(req.index)
        if nxt is not None:
            gap = req.next_gap_s if req.next_gap_s is not None else self.cfg.think_s
            self._push(t + gap, _ARRIVE, nxt)
            return
        if self.gate is not None and req.session is not None:
            self.gate.ended(req.session)
        if self._pending:  # the session ended: its slot goes to the next session
            i = self._pending.pop()
            start = max(t, reqs[i].arrival_s)
            self.last_start_s = start
            self._push(start, _ARRIVE, i)


def simulate_timed(records: Sequence[TraceRecord], contexts: Sequence[RequestContext],
                   cfg: TimedConfig, policy: str, router: str = "round_robin", *,
                   policy_params: dict[str, Any] | None = None,
                   router_params: dict[str, Any] | None = None,
                   wrap_policy: Callable[[EvictionPolicy], EvictionPolicy] | None = None,
                   prepare: Callable[[ClusterSim], None] | None = None,
                   ) -> tuple[ClusterSim, dict[str, Any]]:
    """``run_timed``, also returning the finished simulation. ``wrap_policy`` wraps each
    replica's policy; ``prepare`` sees the simulation before it runs (e.g. to attach a
    host tier to its replicas)."""
    # fresh contexts per run: the simulator writes now_s and warmup into them
    ctxs = [RequestContext(**{f: getattr(c, f) for f in c.__slots__}) for c in contexts]
    bs = cfg.profile.block_size

    def factory() -> EvictionPolicy:
        p = make_policy(policy, block_size=bs, contexts=ctxs, params=policy_params)
        return wrap_policy(p) if wrap_policy is not None else p

    pooled = router == POOLED
    r = None
    if not pooled:
        from anchorage.routing.registry import make_router
        r = make_router(router, **(router_params or {}))
    sim = ClusterSim(cfg, factory, r, pooled=pooled)
    if prepare is not None:
        prepare(sim)
    wl = build_workload(records, ctxs, cfg)
    sim.run(wl)
    out = summarize(sim, wl, policy, router)
    out["capacity_blocks"] = cfg.capacity
    out["profile"] = cfg.profile.name
    out["mode"] = cfg.mode
    return sim, out


def run_timed(records: Sequence[TraceRecord], contexts: Sequence[RequestContext],
              cfg: TimedConfig, policy: str, router: str = "round_robin", *,
              policy_params: dict[str, Any] | None = None,
              router_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate ``records`` (with their ``contexts``, from ``replay.make_contexts``) under one
    eviction policy and one router; returns the report (a JSON-able dict)."""
    return simulate_timed(records, contexts, cfg, policy, router,
                          policy_params=policy_params, router_params=router_params)[1]
