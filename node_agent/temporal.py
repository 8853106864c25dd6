"""The in-engine temporal controller: TokenCake's offload during tool stalls (section 4),
mapped onto vLLM 0.32 without a fork. Pure decisions (``plan_offload``) plus a small
stateful controller over plain data (``TemporalController``) and a thin adapter, the
policy wrapper the engine's block pool drives (``TemporalTiering``).

Specification
-------------
Configuration (``TemporalParams.from_env``, read when the pool builds its policy with
``ANCHORAGE_TIERING=temporal`` or ``spatial,temporal``):

- ``ANCHORAGE_HOST_BYTES`` (required, > 0): the host-memory budget for KV copies, the
  offload connector's ``cpu_bytes_to_use`` (the Helm chart renders both from one value);
- ``ANCHORAGE_HOST_LINK_GBS`` (default 25): host link bandwidth each way, GB/s;
- ``ANCHORAGE_TEMPORAL_WATERMARK`` (default 0.5): the gate's GPU pressure watermark.

Transfer latency 50 us per transfer, as in the simulator (``anchorage.tiering.host_tier``).
Bytes per block come from the engine's KV cache config (``vllm_compat.kv_block_bytes``: the KV
tensors' bytes over the block count, i.e. layers x KV heads x head dim x 2 x dtype bytes x
block size for a plain decoder).

At the end of a turn (the request's blocks are freed: ``on_request_done``) of a real request
that carries a pending tool (``anchorage.tool_name``, optional ``anchorage.tool_args``)
and a session id, the controller:

1. predicts the stall with ``anchorage.tiering.forecast.StallForecaster`` (learned online
   from this engine's observed gaps: turn end to the session's next real request) plus,
   with ``queue_wait`` (default), the engine's admission wait, as the simulator does: a
   returned request's prefix stays free and evictable until it is admitted (these settings
   and the EWMA are ``anchorage.tiering.forecast.IdleEstimate``, which ``TemporalParams``
   extends, as the simulator's ``TieringConfig`` does). The wait is an
   EWMA (weight ``wait_ewma`` 0.2) of arrival-to-admission times of requests admitted for
   the first time: the block-pool driver notes vLLM's ``request.arrival_time`` at the
   request's first admission attempt (not a preempted one's) and calls ``on_admitted(ctx,
   wait_s)`` at its first successful ``allocate_slots`` (one dict look-up per allocation
   while requests wait, none otherwise). The wait is a wall-clock duration (vLLM stamps
   arrivals with ``time.time``); the policy clock is monotonic when serving, so the two add
   up (under a replay's trace clock the wait is the engine's real one);
2. takes the session's blocks: the leading prompt blocks still in the prefix cache (the
   connector offloads prompt blocks), ``n``; transfer times ``latency + n x bytes / bw``
   each way (the connector copies every computed block anyway, so the copy out is an
   upper bound);
3. runs the gate ``anchorage.tiering.temporal.decide_offload`` with: pressure = (blocks
   held by running requests + queued demand when the scheduler's queue is known) /
   capacity; host room = budget blocks - blocks of offloaded sessions not back yet;
   ``free_blocks`` = the pool's free blocks other than the session's (cached ones too:
   the pool does not count its cached free blocks cheaply; the simulator uses uncached
   free blocks, so ``no_fit`` is rarer here);
   ``waiting`` = the scheduler's queue, first 32 requests (new blocks, tokens), when the
   prefix-aware scheduler shows it (``PoolView.waiting_demand``), else unknown, which
   counts as one request that fits (``UNKNOWN_QUEUE``); ``since_move_s`` = time since this session's
   last offload; criticality = the spatial policy's, 0 without ``spatial``;
4. acts on ``anchorage.tiering.temporal.stall_action(decision, stall, survival_s)``:

   - ``offload`` (the gate accepts): ``TieredEviction.demote`` of the session's cached free
     blocks (evicted before anything else: on the CUDA build the connector holds their host
     copies, so early eviction is the offload) and ``reload_at = reload_at_s(end, stall,
     reload, end + offload)`` (end + stall - reload - lead, never before the copy out
     completes);
   - ``hold`` (``stall_short``): ``TieredEviction.hold`` of the session's cached free
     blocks until ``hold_until_s(end, stall)`` (end + stall + max(0.05 s, 0.5 x stall)):
     evicted only after every block of the wrapped policy, so a hold never blocks an
     allocation that has nothing else to take. Released at expiry: ``release(now)`` at the
     first admission attempt of each request (``on_request``, once per request; until then
     an expired hold only stays protected a little longer); and on the session's return:
     held blocks the returning prompt does not start with are released at once, the
     others leave the hold when the request hits them at admission (or at expiry);
   - ``backup`` (``low_pressure``, ``no_fit``, ``churn``, ``low_score`` once the cache has
     turned over: ``survival_s`` finite): nothing to do in the engine: on the CUDA build
     the offload connector already copies every computed block to host memory, so the
     "incremental host copy without early eviction" exists; only counted;
     ``survival_s`` = turnover time (EWMA, weight 0.3, of the time the pool takes to
     evict ``capacity`` blocks, from ``on_evicted``) x free blocks / capacity (free
     blocks, cached or not: the pool does not count its cached free blocks cheaply);
   - ``keep`` (``host_full``, or a rejection before the first turnover): nothing.

   Each stall counts once by its gate reason in ``offloads`` (``ok``, ``emergency`` or a
   rejection) and, when rejected, once more by its action: ``hold``, ``backup``,
   ``keep`` (extra label values of the same counter; the sum of the reasons is still the
   number of stalls).

Pending reloads (offloaded, no warm-up seen yet) go into the plugin's snapshot
(``tiering.pending_reloads``: id, session, ``at_s`` in unix time, blocks, agent, tenant;
the plugin adds the session's last prompt token ids and cache salt from its bounded
registry, ``node_agent.state.SessionPrompts``). The sidecar issues each as a warm-up at
``at_s`` (``anchorage.warmup.ReloadScheduler``: max_tokens=1, ``anchorage.warmup=1``, same
session id and cache salt): the CUDA connector serves it from host memory; the CPU build
has no host tier and recomputes it.

A warm-up of the session (``ctx.warmup``) marks its reload started, and done when it
finishes (h2d bytes = blocks x bytes). Warm-ups never feed the forecaster. The session's
next real request closes the stall: the gap feeds the forecaster, and an offloaded
session's reload outcome is ``in_time`` (warm-up done before, and the reloaded prefix is
cached), ``late`` (warm-up unfinished or never sent: the request itself loads, or
recomputes), ``wasted`` (warm-up done but the reloaded prefix left the cache before use,
or the session did not come back within ``horizon_s``). A request that comes back with
the same request id (vLLM preempted and resumes it) is not a return: its stall is dropped
without learning.

Bounded state: at most ``max_sessions`` stalls (oldest dropped, host room released). Any
exception in the temporal part propagates to the block-pool driver, which counts it
(``anchorage_policy_errors_total``), logs it once and keeps stock behaviour for that
decision (no demotion); the wrapped policy has been notified before.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anchorage.node_agent.tiering import EngineTiering

from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.tiering.forecast import IdleEstimate, StallForecaster
from anchorage.tiering.temporal import (
    Decision,
    GateInput,
    GateParams,
    decide_offload,
    hold_until_s,
    reload_at_s,
    stall_action,
)

ENV_HOST_BYTES = "ANCHORAGE_HOST_BYTES"
ENV_LINK_GBS = "ANCHORAGE_HOST_LINK_GBS"
ENV_WATERMARK = "ANCHORAGE_TEMPORAL_WATERMARK"
UNKNOWN_QUEUE = ((1, 0),)  # scheduler queue not visible: "a waiting request fits"
OUTCOMES = ("in_time", "late", "wasted")
ACTIONS = ("offload", "hold", "backup", "keep")  # anchorage.tiering.temporal.stall_action


@dataclass(frozen=True)
class TemporalParams(IdleEstimate):
    host_bytes: int
    link_gbs: float = 25.0
    latency_s: float = 50e-6
    gate: GateParams = field(default_factory=GateParams)
    horizon_s: float = 600.0
    max_sessions: int = 4096

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.host_bytes <= 0:
            raise ValueError("host_bytes must be > 0")
        if not self.link_gbs > 0 or self.latency_s < 0 or not self.horizon_s > 0:
            raise ValueError("link_gbs and horizon_s must be > 0, latency_s >= 0")

    def transfer_s(self, blocks: int, block_bytes: int) -> float:
        return 0.0 if blocks <= 0 else self.latency_s + blocks * block_bytes / (self.link_gbs * 1e9)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TemporalParams:
        env = os.environ if env is None else env

        def num(name: str, default: float | None) -> float:
            raw = (env.get(name) or "").strip()
            if not raw:
                if default is None:
                    raise ValueError(f"ANCHORAGE_TIERING=temporal needs {name} (the host "
                                     f"memory budget in bytes, the connector's cpu_bytes_to_use)")
                return default
            try:
                v = float(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number, got {raw!r}") from None
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {raw!r}")
            return v

        host = num(ENV_HOST_BYTES, None)
        if host <= 0:
            raise ValueError(f"{ENV_HOST_BYTES} must be > 0, got {host:g}")
        gbs = num(ENV_LINK_GBS, 25.0)
        if gbs <= 0:
            raise ValueError(f"{ENV_LINK_GBS} must be > 0, got {gbs:g}")
        wm = num(ENV_WATERMARK, 0.5)
        if wm > 1:
            raise ValueError(f"{ENV_WATERMARK} must be in [0, 1], got {wm:g}")
        return cls(host_bytes=int(host), link_gbs=gbs, gate=GateParams(watermark=wm))


@dataclass(frozen=True)
class PoolReading:
    """What the gate reads of the engine at a turn end (plain numbers)."""
    capacity_blocks: int
    free_blocks: int               # all free blocks, cached or not
    block_bytes: int
    waiting: Sequence[tuple[int, int]] | None = None  # None: the queue is not visible


def plan_offload(stall_s: float, session_blocks: int, free_session_blocks: int,
                 host_used_blocks: int, reading: PoolReading, params: TemporalParams,
                 since_move_s: float = math.inf, criticality: float = 0.0,
                 end_s: float = 0.0) -> tuple[GateInput, Decision, float | None]:
    """(gate input, decision, reload_at or None). Pure."""
    bb = reading.block_bytes
    if bb <= 0:
        raise ValueError("bytes per KV block unknown")
    cap = max(1, reading.capacity_blocks)
    held = max(0, cap - reading.free_blocks)
    waiting = UNKNOWN_QUEUE if reading.waiting is None else tuple(reading.waiting)
    queued = 0 if reading.waiting is None else sum(d for d, _ in waiting)
    offload_s = reload_s = params.transfer_s(session_blocks, bb)  # the same link each way
    inp = GateInput(
        stall_s=stall_s, offload_s=offload_s, reload_s=reload_s,
        gpu_usage=min(1.0, (held + queued) / cap),
        host_free_blocks=max(0, params.host_bytes // bb - host_used_blocks),
        offload_blocks=session_blocks, freed_blocks=free_session_blocks,
        free_blocks=max(0, reading.free_blocks - free_session_blocks), waiting=waiting,
        since_move_s=since_move_s, criticality=criticality)
    dec = decide_offload(inp, params.gate)
    at = (reload_at_s(end_s, stall_s, reload_s, end_s + offload_s, params.gate)
          if dec.offload else None)
    return inp, dec, at


def survival_s(turnover_s: float, free_blocks: int, capacity_blocks: int) -> float:
    """How long a block freed now stays cached: the free blocks ahead of it over the
    eviction rate (capacity / turnover); ``inf`` before the first turnover. Pure."""
    if not math.isfinite(turnover_s):
        return math.inf
    return turnover_s * max(0, free_blocks) / max(1, capacity_blocks)


def plan_stall(dec: Decision, stall_s: float, end_s: float, survival: float,
               gate: GateParams | None = None) -> tuple[str, float | None]:
    """(action, hold deadline or None) for a stall the gate decided ``dec`` on. Pure."""
    gate = gate or GateParams()
    act = stall_action(dec, stall_s, survival, gate)
    return act, (hold_until_s(end_s, stall_s, gate) if act == "hold" else None)


@dataclass
class Stall:
    """One session between a turn that ended in a tool call and its next real request."""
    sid: str
    rid: Any                      # the request whose end started it
    seq: int
    end_s: float
    tool: Hashable
    args: Any
    blocks: int = 0               # leading prompt blocks (the offloaded ones)
    keys: tuple = ()              # their keys (the last one tells whether they are cached)
    offloaded: bool = False
    reload_at: float | None = None
    reload_started_s: float | None = None
    reload_done_s: float | None = None
    agent: str | None = None
    tenant: str | None = None
    action: str = "keep"          # stall_action's outcome
    hold_until: float | None = None
    held: tuple = ()              # (block id, key) put on hold (the adapter fills it)


class TemporalController:
    """Per-session stalls, the forecaster and the counters (no vLLM objects)."""

    def __init__(self, params: TemporalParams, forecaster: StallForecaster | None = None):
        self.params = params
        self.forecast = forecaster or params.forecaster()
        self.stalls: OrderedDict[str, Stall] = OrderedDict()
        self.last_move: OrderedDict[str, float] = OrderedDict()
        self.host_used = 0            # blocks of offloaded sessions not back yet
        self.offloads: Counter = Counter()   # gate decision -> n
        self.reloads: Counter = Counter()    # outcome -> n
        self.bytes = {"d2h": 0, "h2d": 0}
        self.block_bytes = 0
        self._seq = 0
        self.wait_s = 0.0             # EWMA of admission waits (arrival to first admission)
        self.admissions = 0
        self.evictions = 0
        self.turnover_s = math.inf    # EWMA of the time to evict ``capacity`` blocks
        self._ev_mark = 0
        self._ev_t: float | None = None

    # -- what the engine measures ---------------------------------------------------------

    def admitted(self, wait_s: float) -> None:
        """A request was admitted for the first time ``wait_s`` after its arrival."""
        self.wait_s = self.params.next_wait(self.wait_s, wait_s)
        self.admissions += 1

    def evicted(self, capacity_blocks: int, clock) -> None:
        """One cached block was evicted; ``clock()`` is read once per ``capacity``."""
        self.evictions += 1
        if self._ev_t is None:
            self._ev_t = clock()  # the first eviction: the cache is full from now on
            self._ev_mark = self.evictions
        elif self.evictions - self._ev_mark >= max(1, capacity_blocks):
            now = clock()
            self._ev_mark = self.evictions
            dt = now - self._ev_t
            self._ev_t = now
            self.turnover_s = dt if self.turnover_s == math.inf else (
                0.7 * self.turnover_s + 0.3 * dt)

    def predicted_stall(self, tool: Hashable, args: Any) -> float:
        return self.params.idle_s(self.forecast.predict(tool, args), self.wait_s)

    # -- a turn ends ----------------------------------------------------------------------

    def turn_end(self, ctx: RequestContext, keys: Sequence[Hashable], free_blocks: int,
                 reading: PoolReading, now: float, criticality: float = 0.0) -> Decision:
        """``keys``: the session's leading prompt blocks still cached; ``free_blocks``: how
        many of them are free (evictable). Returns the gate's decision; the stall
        (``self.stalls[sid]``) carries the action and the hold deadline."""
        sid = ctx.session_id
        self._close(sid, None, now, returned=False)
        self.expire(now)
        self._seq += 1
        tool = ctx.tool_name
        st = Stall(sid, ctx.request_id, self._seq, now, tool, ctx.tool_args,
                   blocks=len(keys), keys=tuple(keys[-1:]), agent=ctx.agent_hint,
                   tenant=ctx.tenant)
        self.stalls[sid] = st
        while len(self.stalls) > self.params.max_sessions:
            self._drop(self.stalls.popitem(last=False)[1])
        stall = self.predicted_stall(tool, ctx.tool_args)
        self.block_bytes = reading.block_bytes
        _, dec, at = plan_offload(stall, len(keys), free_blocks, self.host_used, reading,
                                  self.params, now - self.last_move.get(sid, -math.inf),
                                  criticality, now)
        st.action, st.hold_until = plan_stall(
            dec, stall, now,
            survival_s(self.turnover_s, reading.free_blocks, reading.capacity_blocks),
            self.params.gate)
        self.offloads[dec.reason] += 1
        if not dec.offload:
            self.offloads[st.action] += 1
        if dec.offload:
            st.offloaded = True
            st.reload_at = at
            self.host_used += st.blocks
            self.bytes["d2h"] += st.blocks * reading.block_bytes
            self.last_move[sid] = now
            self.last_move.move_to_end(sid)
            while len(self.last_move) > self.params.max_sessions:
                self.last_move.popitem(last=False)
        return dec

    # -- requests -------------------------------------------------------------------------

    def request(self, ctx: RequestContext, now: float, cached: Any = ()) -> str | None:
        """A request of a session starts (``cached``: ``key in cached`` for the prefix
        cache). A warm-up starts the reload; a real request closes the stall. Returns the
        reload outcome when one is decided."""
        sid = ctx.session_id
        st = self.stalls.get(sid) if sid is not None else None
        if st is None:
            return None
        if ctx.warmup:
            if st.offloaded and st.reload_started_s is None:
                st.reload_started_s = now
            return None
        if ctx.request_id == st.rid:  # vLLM resumes a preempted request: not a return
            self._close(sid, None, now, returned=False, learn=False)
            return None
        return self._close(sid, cached, now, returned=True)

    def warmup_done(self, ctx: RequestContext, now: float) -> None:
        st = self.stalls.get(ctx.session_id) if ctx.session_id is not None else None
        if st is None or not st.offloaded or st.reload_started_s is None:
            return
        if st.reload_done_s is None:
            st.reload_done_s = now
            self.bytes["h2d"] += st.blocks * self.block_bytes

    def _close(self, sid: Any, cached: Any, now: float, returned: bool,
               learn: bool = True) -> str | None:
        st = self.stalls.pop(sid, None) if sid is not None else None
        if st is None:
            return None
        if returned and learn:
            self.forecast.observe(now - st.end_s, st.tool, st.args)
        out = None
        if st.offloaded:
            if not returned:
                out = "wasted" if st.reload_done_s is not None and learn else None
            elif st.reload_done_s is not None and st.reload_done_s <= now:
                out = "in_time" if (not st.keys or st.keys[-1] in cached) else "wasted"
            else:
                out = "late"
                self.bytes["h2d"] += st.blocks * self.block_bytes  # loaded on demand
            self._drop(st, count=False)
        if out is not None:
            self.reloads[out] += 1
        return out

    def _drop(self, st: Stall, count: bool = True) -> None:
        if st.offloaded:
            self.host_used = max(0, self.host_used - st.blocks)
            if count and st.reload_done_s is not None:
                self.reloads["wasted"] += 1

    def expire(self, now: float) -> None:
        """Stalls older than the horizon: the session did not come back."""
        h = self.params.horizon_s
        while self.stalls:
            sid, st = next(iter(self.stalls.items()))
            if now - st.end_s <= h:
                break
            del self.stalls[sid]
            if st.offloaded:
                self.host_used = max(0, self.host_used - st.blocks)
                self.reloads["wasted"] += 1

    # -- what the snapshot carries --------------------------------------------------------

    def pending(self) -> list[Stall]:
        return [st for st in list(self.stalls.values())
                if st.offloaded and st.reload_started_s is None and st.reload_at is not None]

    def view(self, mono_now: float, unix_now: float) -> dict[str, Any]:
        return {
            "offloads": dict(self.offloads),
            "reloads": {o: int(self.reloads.get(o, 0)) for o in OUTCOMES},
            "bytes": dict(self.bytes),
            "pending_reloads": [
                {"id": f"{st.sid}#{st.seq}", "session": st.sid,
                 "at_s": unix_now + (st.reload_at - mono_now), "blocks": st.blocks,
                 "agent": st.agent, "tenant": st.tenant}
                for st in self.pending()],
        }


class TemporalTiering(EngineTiering):
    """The engine's policy wrapper: ``EngineTiering`` (spatial reservation when
    ``spatial``) plus the temporal controller on the pool's notifications."""

    def __init__(self, inner: EvictionPolicy, params: TemporalParams, spatial: bool = False,
                 clock=None):
        super().__init__(inner)
        self.spatial = spatial
        self.temporal = TemporalController(params)
        from anchorage.node_agent.request_context import policy_clock

        self.clock = clock or policy_clock

    def update(self, now: float = 0.0):
        return super().update(now) if self.spatial else {}

    def on_request(self, ctx: RequestContext) -> None:
        super().on_request(ctx)
        if self.held:  # once per request: holds past their deadline go back
            self.release(ctx.now_s)
        sid = ctx.session_id
        st = self.temporal.stalls.get(sid) if sid is not None else None
        if st is not None and st.held and not ctx.warmup and ctx.request_id != st.rid:
            self._release_returned(st, ctx)
        self.temporal.request(ctx, ctx.now_s, self.pool.cached)

    def on_admitted(self, ctx: RequestContext, wait_s: float) -> None:
        """The driver: ``ctx``'s request was admitted ``wait_s`` after its arrival."""
        self.temporal.admitted(wait_s)

    def on_evicted(self, block: int, key: Hashable) -> None:
        self.temporal.evicted(self.pool.capacity_blocks, self.clock)
        super().on_evicted(block, key)

    def _release_returned(self, st: Stall, ctx: RequestContext) -> None:
        """The session is back: held blocks its prompt does not start with go back to the
        wrapped policy now; the others leave the hold when the request hits them."""
        lead = set(ctx.keys[:len(st.held)])
        held, bkey = self.held, self.pool.block_key
        out = [b for b, k in st.held if k not in lead and b in held and bkey[b] == k]
        st.held = ()
        if out:
            self.hold(out, ctx.now_s)  # due now
            self.release(ctx.now_s)

    def on_request_done(self, ctx: RequestContext) -> None:
        super().on_request_done(ctx)
        if ctx.session_id is None:
            return
        if ctx.warmup:
            self.temporal.warmup_done(ctx, ctx.now_s)
        elif ctx.tool_name is not None:
            self._turn_end(ctx)

    def session_blocks(self, ctx: RequestContext) -> tuple[list, list[int]]:
        """(keys, block ids) of the request's leading full prompt blocks still cached."""
        view = self.pool
        n = min(len(ctx.keys), ctx.input_length // max(1, view.block_size))
        keys, ids = [], []
        get = view.cached.get
        for k in ctx.keys[:n]:
            b = get(k)
            if b is None:
                break
            keys.append(k)
            ids.append(b)
        return keys, ids

    def _turn_end(self, ctx: RequestContext) -> None:
        view = self.pool
        keys, ids = self.session_blocks(ctx)
        ref = view.ref_cnt
        pairs = [(b, k) for b, k in zip(ids, keys) if ref[b] == 0]  # free: evictable
        free = [b for b, _ in pairs]
        reading = PoolReading(view.capacity_blocks, view.num_free_blocks,
                              int(getattr(view, "bytes_per_block", 0) or 0),
                              view.waiting_demand())
        crit = (self.criticality.get(ctx.agent_hint, 0.0)
                if self.spatial and ctx.agent_hint else 0.0)
        dec = self.temporal.turn_end(ctx, keys, len(free), reading, ctx.now_s, crit)
        if not free:
            return
        if dec.offload:
            self.demote(reversed(free))  # a chain's tail first, as vLLM frees
            return
        st = self.temporal.stalls.get(ctx.session_id)
        if st is not None and st.action == "hold" and st.hold_until is not None:
            self.hold(reversed(free), st.hold_until)
            st.held = tuple(pairs)

    def tiering_view(self) -> dict[str, Any]:
        out = super().tiering_view() if self.spatial else {"reserved_blocks": {}}
        out["mode"] = "spatial,temporal" if self.spatial else "temporal"
        for _ in range(3):
            try:
                out.update(self.temporal.view(self.clock(), time.time()))
                break
            except RuntimeError:  # the engine thread changed a dict under us
                continue
        return out
