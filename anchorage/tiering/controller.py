"""The temporal controller (TokenCake section 4): one home for what happens to a session's
KV cache between a turn that ends in a tool call and the session's next request. The
simulator (``anchorage.tiering.replica.SimTiering``) and the engine
(``anchorage.node_agent.temporal.TemporalTiering``) fill typed readings, call it, and act
on its plan. The decisions are ``anchorage.tiering.temporal``'s pure functions.

Specification
-------------
Readings, filled by the adapter at a turn end (plain numbers):

- ``PoolReading``: ``capacity_blocks``; ``free_blocks``, every free block, cached or not
  (vLLM's ``num_free_blocks``); ``cached_free_blocks``, the free blocks that hold a cached
  block (evicting one loses its content); ``block_bytes`` (KV bytes of one block over all
  layers, > 0); ``waiting``, the first ``max_waiting_scan`` queued requests in queue order
  as (incremental block demand, prefill tokens), or None when the adapter cannot see the
  queue; ``tokens_per_s`` (prefill throughput; inf when unknown); ``d2h_wait_s`` (time
  until the device-to-host link is idle; 0 when the adapter does not model the link).
- ``SessionReading``: ``gpu_blocks``, the session's leading full prompt blocks still
  cached on GPU; ``copy_blocks``, those of them host memory lacks (what an offload copies;
  ``gpu_blocks`` when the adapter cannot see host memory); ``recompute_s``, their prefill
  time were they recomputed (inf when unknown).

Free blocks, one meaning for both adapters: the gate's fit test counts the *uncached* free
blocks, ``free_blocks - cached_free_blocks``: what a waiting request takes without
evicting anything (``GateInput.free_blocks``); a block freed now survives behind the
*cached* free blocks (``survival_s``); the pressure counts every free block as free.

Gate input (``gate_input``) for a stall predicted to idle ``stall_s``:

- ``offload_s = d2h_wait_s + latency + copy_blocks x block_bytes / d2h_bytes_s``;
  ``reload_s = latency + gpu_blocks x block_bytes / h2d_bytes_s`` (``params.host``);
- ``gpu_usage`` = ``pressure``: ``min(1, (capacity - free_blocks + sum of the waiting
  demand) / capacity)``;
- ``host_free_blocks`` = host capacity in blocks - host occupancy, the distinct keys of the
  sessions offloaded and not back yet (a prefix several sessions share counts once);
- ``offload_blocks = copy_blocks``, ``freed_blocks = gpu_blocks``, ``free_blocks`` = the
  uncached free blocks; ``waiting`` = the reading's, or ``UNKNOWN_QUEUE`` (one request
  that fits) when it is None;
- ``since_move_s`` = turn end - the session's last offload or reload (inf if none);
  ``criticality`` (the spatial policy's, 0 without it) and ``recompute_s`` as given.

Stalls (``Stall``, per session id):

- ``turn_end(sid, now, tool, args)``: expires stalls older than ``horizon_s``, closes the
  session's open stall (unreturned), opens a new one; at most ``max_sessions`` stay open,
  the oldest dropped first. Every dropped stall releases its host occupancy and goes to
  ``dropped(st, why)`` (``why``: ``replaced``, ``bounded``, ``expired``), a hook for the
  adapter's outcome counts.
- ``plan(st, session, pool, criticality)`` (a session with GPU blocks): the predicted idle
  time ``stall_s = params.idle_s(forecast.predict(tool, args), wait_s)``
  (``anchorage.tiering.forecast.IdleEstimate``); the decision ``decide_offload`` (counted
  by reason in ``gate``); the action ``stall_action(decision, stall_s, survival_s)``
  (counted in ``actions``: ``offload``, ``hold``, ``backup``, ``keep``); for a hold,
  ``hold_until = hold_until_s(end, stall_s)``; the demotion priority ``reuse_s = end +
  stall_s`` (the furthest predicted reuse is evicted first).
- ``offloaded(st, now, done_s, keys)``: the adapter copied the session's blocks (an
  offload, a backup, or a naive mode's copy), the copy completing at ``done_s``: the keys
  count in the host occupancy until the stall closes, the session moved at ``now``, and
  with a finite ``stall_s`` the warm-up is due at ``reload_at = reload_at_s(end, stall_s,
  reload_s, done_s)``.
- ``moved(sid, now)``: the session was offloaded or reloaded (the churn test's clock).
- ``returned(sid, now, learn=True)``: the session's next request; closes the stall, the gap
  ``now - end`` feeds the forecaster unless ``learn`` is False (vLLM resumed a preempted
  request: not a return).

Measured inputs: ``admitted(waited_s)``, a request's first admission, ``waited_s`` after its
arrival (the admission wait, ``IdleEstimate.next_wait``); ``observe_evictions(total,
now)``, the pool's cumulative evictions (``anchorage.pool.turnover.TurnoverEstimator``,
weight 0.3; clock start ``turnover_start_s``: None starts at the first eviction, the
simulator passes 0.0); ``survival_s(cached_free)`` = turnover time x cached free blocks /
capacity, inf before the first turnover. ``reload_worth(recompute_s, blocks, block_bytes)``:
the reload test ``worth_moving`` for blocks in host memory.

Parameters: ``anchorage.tiering.params.TemporalParams``.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from anchorage.pool.turnover import TurnoverEstimator
from anchorage.tiering.params import TemporalParams
from anchorage.tiering.temporal import (
    Decision,
    GateInput,
    decide_offload,
    hold_until_s,
    reload_at_s,
    stall_action,
    worth_moving,
)

UNKNOWN_QUEUE = ((1, 0),)  # the queue is not visible: "a waiting request fits"


def pressure(capacity_blocks: int, free_blocks: int,
             waiting: Iterable[tuple[int, int]] | None) -> float:
    """Blocks held by running requests plus the queued demand, over the capacity (<= 1)."""
    cap = max(1, capacity_blocks)
    held = max(0, cap - free_blocks)
    queued = 0 if waiting is None else sum(d for d, _ in waiting)
    return min(1.0, (held + queued) / cap)


@dataclass(frozen=True, slots=True)
class PoolReading:
    capacity_blocks: int
    free_blocks: int
    cached_free_blocks: int
    block_bytes: int
    waiting: Sequence[tuple[int, int]] | None = None
    tokens_per_s: float = math.inf
    d2h_wait_s: float = 0.0

    @property
    def uncached_free_blocks(self) -> int:
        """Free blocks a request takes without evicting anything."""
        return max(0, self.free_blocks - self.cached_free_blocks)

    @property
    def pressure(self) -> float:
        return pressure(self.capacity_blocks, self.free_blocks, self.waiting)


@dataclass(frozen=True, slots=True)
class SessionReading:
    gpu_blocks: int
    copy_blocks: int
    recompute_s: float = math.inf


@dataclass(slots=True, eq=False)
class Stall:
    """One session between a turn that ended in a tool call and its next request."""
    sid: Hashable
    seq: int
    end_s: float
    tool: Hashable
    args: Any = None
    rid: Any = None                 # the request whose end started it
    agent: Any = None
    tenant: str | None = None
    blocks: int = 0                 # the session's GPU blocks when it was planned
    idle_s: float = math.inf        # predicted idle time (plan)
    offload_s: float = 0.0
    reload_s: float = 0.0
    reason: str | None = None       # the gate's decision (None: not planned)
    action: str = "keep"
    hold_until: float | None = None
    reuse_s: float = math.inf       # when the session is expected back (demotion order)
    offloaded: bool = False
    reload_at: float | None = None
    keys: tuple = ()                # the keys offloaded (host occupancy while pinned)
    pinned: bool = False
    reload_started_s: float | None = None  # reload progress, as the adapter records it
    reload_done_s: float | None = None
    held: tuple = ()                # (block id, key) put on hold, as the adapter records it


def gate_input(stall_s: float, session: SessionReading, pool: PoolReading,
               params: TemporalParams, host_used_blocks: int, since_move_s: float = math.inf,
               criticality: float = 0.0) -> GateInput:
    """The gate's input for a stall (the module's specification). Pure."""
    bb = pool.block_bytes
    if bb <= 0:
        raise ValueError("bytes per KV block unknown")
    h = params.host
    return GateInput(
        stall_s=stall_s,
        offload_s=pool.d2h_wait_s + h.d2h_s(session.copy_blocks * bb),
        reload_s=h.h2d_s(session.gpu_blocks * bb),
        gpu_usage=pool.pressure,
        host_free_blocks=h.capacity_blocks(bb) - host_used_blocks,
        offload_blocks=session.copy_blocks, freed_blocks=session.gpu_blocks,
        free_blocks=pool.uncached_free_blocks,
        waiting=UNKNOWN_QUEUE if pool.waiting is None else pool.waiting,
        tokens_per_s=pool.tokens_per_s, since_move_s=since_move_s, criticality=criticality,
        recompute_s=session.recompute_s)


class TemporalController:
    """Stalls, the forecaster, the admission wait, the turnover and the counters of one pool
    (plain data; the module's specification)."""

    def __init__(self, params: TemporalParams, capacity_blocks: int = 1, *,
                 turnover_start_s: float | None = None):
        self.params = params
        self.forecast = params.forecaster()
        self.stalls: OrderedDict[Hashable, Stall] = OrderedDict()
        self.last_move: OrderedDict[Hashable, float] = OrderedDict()
        self.pins: Counter = Counter()   # host occupancy: key -> open stalls holding it
        self.gate: Counter = Counter()   # decision reason -> stalls
        self.actions: Counter = Counter()
        self.wait_s = 0.0
        self.admissions = 0
        self._seq = 0
        self._start = turnover_start_s
        self.turnover = TurnoverEstimator(capacity_blocks, start_s=turnover_start_s)

    def attach(self, capacity_blocks: int) -> None:
        """The pool's capacity is known now (a fresh turnover estimate)."""
        self.turnover = TurnoverEstimator(capacity_blocks, start_s=self._start)

    # -- measured inputs ------------------------------------------------------------------

    def admitted(self, waited_s: float) -> None:
        self.wait_s = self.params.next_wait(self.wait_s, waited_s)
        self.admissions += 1

    def observe_evictions(self, total: int, now: float) -> float:
        return self.turnover.observe(total, now)

    @property
    def turnover_s(self) -> float:
        return self.turnover.turnover_s

    def survival_s(self, cached_free_blocks: int) -> float:
        return self.turnover.survival_s(cached_free_blocks)

    def predicted_idle_s(self, tool: Hashable, args: Any = None) -> float:
        return self.params.idle_s(self.forecast.predict(tool, args), self.wait_s)

    def reload_worth(self, recompute_s: float, blocks: int, block_bytes: int) -> bool:
        """Whether reloading ``blocks`` from host memory beats recomputing them."""
        return worth_moving(recompute_s, self.params.host.h2d_s(blocks * block_bytes),
                            self.params.gate)

    @property
    def host_used_blocks(self) -> int:
        return len(self.pins)

    # -- stalls ---------------------------------------------------------------------------

    def turn_end(self, sid: Hashable, now: float, tool: Hashable, args: Any = None, *,
                 rid: Any = None, agent: Any = None, tenant: str | None = None) -> Stall:
        old = self.stalls.pop(sid, None)
        if old is not None:
            self._release(old, "replaced")
        self.expire(now)
        self._seq += 1
        st = self.stalls[sid] = Stall(sid, self._seq, now, tool, args, rid, agent, tenant)
        while len(self.stalls) > self.params.max_sessions:
            self._release(self.stalls.popitem(last=False)[1], "bounded")
        return st

    def plan(self, st: Stall, session: SessionReading, pool: PoolReading,
             criticality: float = 0.0) -> Decision:
        gate = self.params.gate
        stall = self.predicted_idle_s(st.tool, st.args)
        inp = gate_input(stall, session, pool, self.params, len(self.pins),
                         st.end_s - self.last_move.get(st.sid, -math.inf), criticality)
        dec = decide_offload(inp, gate)
        act = stall_action(dec, stall, self.survival_s(pool.cached_free_blocks), gate)
        st.blocks = session.gpu_blocks
        st.idle_s, st.offload_s, st.reload_s = stall, inp.offload_s, inp.reload_s
        st.reason, st.action = dec.reason, act
        st.hold_until = hold_until_s(st.end_s, stall, gate) if act == "hold" else None
        st.reuse_s = st.end_s + stall
        self.gate[dec.reason] += 1
        self.actions[act] += 1
        return dec

    def offloaded(self, st: Stall, now: float, done_s: float, keys: Sequence[Hashable]) -> None:
        self._unpin(st)
        st.keys = tuple(keys)
        pins = self.pins
        for k in st.keys:
            pins[k] += 1
        st.pinned = True
        st.offloaded = True
        self.moved(st.sid, now)
        if math.isfinite(st.idle_s):
            st.reload_at = reload_at_s(st.end_s, st.idle_s, st.reload_s, done_s,
                                       self.params.gate)

    def moved(self, sid: Hashable, now: float) -> None:
        lm = self.last_move
        lm[sid] = now
        lm.move_to_end(sid)
        while len(lm) > self.params.max_sessions:
            lm.popitem(last=False)

    def returned(self, sid: Hashable, now: float, learn: bool = True) -> Stall | None:
        st = self.stalls.pop(sid, None)
        if st is None:
            return None
        if learn:
            self.forecast.observe(now - st.end_s, st.tool, st.args)
        self._unpin(st)
        return st

    def expire(self, now: float) -> None:
        """Stalls older than the horizon: the session did not come back."""
        h = self.params.horizon_s
        stalls = self.stalls
        while stalls:
            st = next(iter(stalls.values()))
            if now - st.end_s <= h:
                break
            del stalls[st.sid]
            self._release(st, "expired")

    def dropped(self, st: Stall, why: str) -> None:
        """A stall closed without its session's return (for the adapter's counts)."""

    def _release(self, st: Stall, why: str) -> None:
        self._unpin(st)
        self.dropped(st, why)

    def _unpin(self, st: Stall) -> None:
        if not st.pinned:
            return
        st.pinned = False
        pins = self.pins
        for k in st.keys:
            if pins[k] <= 1:
                del pins[k]
            else:
                pins[k] -= 1
