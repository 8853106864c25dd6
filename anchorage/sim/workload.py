"""Requests grouped for the timed simulation's arrivals (``anchorage.sim.cluster``'s
specification, "Arrivals"): open loop at trace times, closed loop per session."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.sim.engine import SimRequest
from anchorage.trace.format import TraceRecord


@dataclass
class Workload:
    """Requests grouped for arrival: ``first`` arrive at fixed times; ``following[i]`` is
    the request that follows request ``i`` in its session (closed loop)."""

    requests: list[SimRequest]
    first: list[int]
    following: dict[int, int] = field(default_factory=dict)


def build_workload(records: Sequence[TraceRecord], contexts: Sequence[RequestContext],
                   cfg) -> Workload:
    """``cfg``: the ``TimedConfig`` (mode, time scale, think time, warm-up)."""
    reqs: list[SimRequest] = []
    for i, (rec, ctx) in enumerate(zip(records, contexts)):
        warm = bool(rec.extra and rec.extra.get("warmup"))
        ctx.warmup = ctx.warmup or warm
        t = rec.timestamp / 1000.0 * cfg.time_scale
        req = SimRequest(ctx, t, session=rec.session_id, index=i,
                         measured=not warm and t >= cfg.warmup_s)
        if req.tool is None and rec.tool_duration_ms is not None:
            req.tool = "tool_use"  # the turn stopped for a tool call (its name unknown)
        reqs.append(req)
    if cfg.mode == "open":
        return Workload(reqs, list(range(len(reqs))))
    by_session: dict[Hashable, list[int]] = defaultdict(list)
    first: list[int] = []
    for i, rec in enumerate(records):
        if rec.session_id is None:
            first.append(i)
        else:
            by_session[rec.session_id].append(i)
    following: dict[int, int] = {}
    for idx in by_session.values():
        idx.sort(key=lambda j: (records[j].timestamp, j))
        first.append(idx[0])
        for a, b in zip(idx, idx[1:]):
            following[a] = b
            d = records[a].tool_duration_ms
            reqs[a].next_gap_s = d / 1000.0 if d is not None else cfg.think_s
    first.sort()
    return Workload(reqs, first, following)
