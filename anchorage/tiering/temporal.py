"""Temporal policy (TokenCake section 4): offload a stalled session's KV to host memory
only when it pays, and reload it just before the session comes back. Pure functions; the
temporal controller (``anchorage.tiering.controller``) assembles their inputs from typed
readings and keeps the per-session state, for the simulator and the engine alike.

Specification
-------------
Inputs at the end of a turn that stopped for a tool call (``GateInput``):
``stall_s`` (the predicted idle time of the session's KV: the tool's stall,
E[tau | tau > elapsed] from the stall forecaster, plus the expected wait for admission
once it is back, measured; under vLLM a returned request's prefix blocks stay free and
evictable until it is admitted, so the stall the cache sees lasts until admission),
``offload_s`` / ``reload_s`` (transfer times of the session's blocks, host link idle),
``gpu_usage`` (fraction of GPU blocks held by running requests, vLLM's KV usage),
``host_free_blocks``, ``offload_blocks`` (blocks to copy out: the session's GPU blocks
not already in host memory), ``freed_blocks`` (GPU blocks the offload frees: all the
session's cached GPU blocks), ``free_blocks`` (GPU blocks free without eviction),
``waiting`` (queued requests in queue order: (incremental block demand, prefill tokens)),
``tokens_per_s`` (observed prefill throughput), ``since_move_s`` (time since this session
was last offloaded or reloaded, ``inf`` if never), ``criticality`` in [0, 1] (the spatial
policy's agent score, normalised), ``recompute_s`` (the prefill time the session's blocks
would cost if they were lost and recomputed, from the cost model; ``inf`` when unknown).

Window: ``window_s = stall_s - (offload_s + reload_s)`` (the paper's round trip). With
``count_reload=False`` (default True) it is ``stall_s - offload_s``: under vLLM's prefix
cache a session that is not offloaded is not kept either (its blocks are free and get
evicted under pressure), so a reload that finishes after the return (the request waits
for it) still beats a recomputation; only the copy out must fit in the stall.

Hard rejections, checked in this order (the decision's ``reason``):

1. ``host_full``: ``host_free_blocks < offload_blocks``;
2. ``stall_short``: ``window_s <= 0`` (the stall does not cover the round trip);
3. ``low_saving``: ``recompute_s < min_saving_ratio x reload_s``: the recomputation the
   reload saves is worth less than the link time it costs (benefit per byte; default
   ratio 1, the break-even; a higher ratio trades latency for bytes, longest contexts
   kept, since attention makes their prefill dearer per byte). The copy out is not
   charged: it is incremental and each copied block serves every later return of the
   session, so a one-return account would reject every first copy, and with it every
   later one (measurements: ``docs/research/tiering.md``);
4. ``low_pressure``: ``gpu_usage < watermark`` (default 0.5);
5. ``no_fit``: no waiting request fits the freed blocks: first fit in queue order, the
   first request with ``demand <= free_blocks + freed_blocks`` and ``demand > 0`` whose
   prefill fits the window's token capacity ``window_s x tokens_per_s``;
6. ``churn``: ``since_move_s < churn_s`` (default 2 s): a session moved recently stays.

Soft score (no hard rejection): ``score = window_s / stall_s + (gpu_usage - watermark)
- critical_penalty x criticality`` (default penalty 0.6); offload when ``score >=
threshold`` (default 0.5), else the reason is ``low_score``. Emergency exception: with
``gpu_usage >= emergency_usage`` (0.98) and ``window_s / stall_s >= 0.8`` a critical agent
is offloaded anyway.

What happens to the session's blocks (``stall_action(decision, idle_s, survival_s)``).
In TokenCake a stalled agent that is not offloaded keeps its GPU memory; under vLLM's
prefix cache its blocks are free and the eviction policy drops them under pressure, so
each rejection is handled explicitly:

- ``offload`` (the gate accepts): copy the blocks host memory lacks, then evict them
  first (the furthest predicted reuse first), and reload them just in time;
- ``hold`` (``stall_short``: back before a round trip completes): the blocks stay on GPU,
  evicted only after every other unprotected block, until ``hold_until_s = end_s +
  stall_s + max(min_hold_s, hold_margin x stall_s)`` (defaults 0.05 s, 0.5);
- ``backup`` (``low_pressure``, ``no_fit``, ``churn``, ``low_score``: offloading would
  not help now, but the blocks are not kept either): when the idle time exceeds
  ``backup_ratio x survival_s`` (default ratio 0: whenever the cache evicts at all), copy
  the blocks host memory lacks and leave them in the eviction policy's order: if they are
  evicted, the return reloads them instead of recomputing; ``survival_s`` is how long a
  block freed now stays cached (cached free blocks x measured turnover time / capacity;
  ``inf`` before the cache has turned over once: then nothing is backed up);
- ``keep`` (``host_full``, ``low_saving``, or a backup not worth it): nothing.

With ``hold_rejected`` (default False; TokenCake as published, where a stalled agent that
is not offloaded keeps its GPU memory) every rejection is a ``hold``.

Reload timing (the warm-up): a reload starts at ``reload_at_s = end_s + stall_s -
reload_s - lead_s`` (default lead 10 % of the stall, at least 5 ms), not before the
offload completes; a tool that returns before then triggers an immediate reload.

Reload test (``worth_moving(recompute_s, link_s)``): a reload (warm-up or at admission)
of blocks in host memory is made only when ``recompute_s >= min_saving_ratio x link_s``
(the same benefit per byte, for the blocks it brings back); otherwise they are
recomputed.

Reload outcome (``reload_outcome``): ``in_time`` when the reload completed before the
session's next request needed it, ``late`` when the request waited for it (including a
reload started by the request itself), ``wasted`` when the session did not return to use
it (the reloaded blocks were dropped first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GateParams:
    watermark: float = 0.5
    churn_s: float = 2.0
    critical_penalty: float = 0.6
    threshold: float = 0.5
    emergency_usage: float = 0.98
    emergency_margin: float = 0.8
    lead_frac: float = 0.1
    min_lead_s: float = 0.005
    count_reload: bool = True
    hold_margin: float = 0.5
    min_hold_s: float = 0.05
    backup_ratio: float = 0.0
    min_saving_ratio: float = 1.0
    hold_rejected: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.watermark <= 1:
            raise ValueError("watermark must be in [0, 1]")
        if min(self.churn_s, self.lead_frac, self.min_lead_s, self.hold_margin,
               self.min_hold_s, self.backup_ratio) < 0:
            raise ValueError("churn_s, lead_frac, min_lead_s, hold_margin, min_hold_s and "
                             "backup_ratio must be >= 0")
        if not (self.min_saving_ratio >= 0 and math.isfinite(self.min_saving_ratio)):
            raise ValueError("min_saving_ratio must be a finite number >= 0")


@dataclass(frozen=True)
class GateInput:
    stall_s: float
    offload_s: float
    reload_s: float
    gpu_usage: float
    host_free_blocks: int
    offload_blocks: int
    freed_blocks: int
    free_blocks: int
    waiting: Sequence[tuple[int, int]] = field(default_factory=tuple)
    tokens_per_s: float = math.inf
    since_move_s: float = math.inf
    criticality: float = 0.0
    recompute_s: float = math.inf


@dataclass(frozen=True)
class Decision:
    offload: bool
    reason: str          # "ok", "emergency" or the rejection
    window_s: float
    score: float = 0.0
    fit_index: int = -1  # the waiting request that fits (first fit), -1 if none


def first_fit(waiting: Sequence[tuple[int, int]], room_blocks: int,
              token_capacity: float) -> int:
    """Index of the first queued request (demand, prefill tokens) that fits, or -1."""
    for i, (demand, tokens) in enumerate(waiting):
        if 0 < demand <= room_blocks and tokens <= token_capacity:
            return i
    return -1


def decide_offload(inp: GateInput, p: GateParams = GateParams()) -> Decision:
    window = inp.stall_s - (inp.offload_s + (inp.reload_s if p.count_reload else 0.0))
    if inp.host_free_blocks < inp.offload_blocks:
        return Decision(False, "host_full", window)
    if not window > 0:
        return Decision(False, "stall_short", window)
    if not worth_moving(inp.recompute_s, inp.reload_s, p):
        return Decision(False, "low_saving", window)
    if inp.gpu_usage < p.watermark:
        return Decision(False, "low_pressure", window)
    fit = first_fit(inp.waiting, inp.free_blocks + inp.freed_blocks,
                    window * inp.tokens_per_s)
    if fit < 0:
        return Decision(False, "no_fit", window)
    if inp.since_move_s < p.churn_s:
        return Decision(False, "churn", window, fit_index=fit)
    margin = window / inp.stall_s
    score = margin + (inp.gpu_usage - p.watermark) - p.critical_penalty * inp.criticality
    if score >= p.threshold:
        return Decision(True, "ok", window, score, fit)
    if inp.gpu_usage >= p.emergency_usage and margin >= p.emergency_margin:
        return Decision(True, "emergency", window, score, fit)
    return Decision(False, "low_score", window, score, fit)


def worth_moving(recompute_s: float, link_s: float, p: GateParams = GateParams()) -> bool:
    """Whether moving blocks over the host link (``link_s``) beats recomputing them
    (``recompute_s``) by at least ``min_saving_ratio``."""
    return recompute_s >= p.min_saving_ratio * link_s


def reload_at_s(end_s: float, stall_s: float, reload_s: float, offload_done_s: float,
                p: GateParams = GateParams()) -> float:
    """When the warm-up reload starts: ahead of the predicted return by the transfer time
    plus a lead, never before the offload completed."""
    lead = max(p.min_lead_s, p.lead_frac * stall_s)
    return max(offload_done_s, end_s + stall_s - reload_s - lead)


def stall_action(dec: Decision, idle_s: float, survival_s: float,
                 p: GateParams = GateParams()) -> str:
    """What happens to a stalled session's GPU blocks after the gate's decision ``dec``:
    ``offload``, ``hold``, ``backup`` or ``keep`` (the module's specification)."""
    if dec.offload:
        return "offload"
    if dec.reason == "stall_short" or p.hold_rejected:
        return "hold"
    if (dec.reason not in ("host_full", "low_saving") and math.isfinite(survival_s)
            and idle_s > p.backup_ratio * survival_s):
        return "backup"
    return "keep"


def hold_until_s(end_s: float, stall_s: float, p: GateParams = GateParams()) -> float:
    """Until when a short stall's blocks stay protected on GPU: the predicted return plus
    a margin (``hold_margin`` of the stall, at least ``min_hold_s``)."""
    return end_s + stall_s + max(p.min_hold_s, p.hold_margin * stall_s)


def reload_outcome(reload_done_s: float | None, needed_s: float | None) -> str:
    """``in_time`` / ``late`` / ``wasted`` for a reload that completes at
    ``reload_done_s`` and is needed at ``needed_s`` (None: never used)."""
    if needed_s is None or reload_done_s is None:
        return "wasted"
    return "in_time" if reload_done_s <= needed_s else "late"
