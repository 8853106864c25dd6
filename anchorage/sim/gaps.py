"""Tool-gap distributions: measure a workload's, and map its tool durations onto another's.

Specification
-------------
In the closed loop a session's next request arrives when its previous one completed plus
that record's ``tool_duration_ms`` (the *tool gap*). The generator's tool classes
(``anchorage.trace.generate.TOOLS``) give medians of 15 ms to 75 s, so the gaps of a
generated workload depend on which tools its agents drew (``selector`` seeds 1-3: median
0.08 / 0.75 / 0.94 s). Real coding-agent gaps are longer: the client's round trip and
the tool itself take seconds even for a file read.

- ``tool_gap_quantiles(records, points=101, cutoff_ms=None) -> list[float]``: the
  ``points`` evenly spaced quantiles (p0 .. p100, linear interpolation between order
  statistics) of ``tool_duration_ms`` over the records that have one, ignoring gaps above
  ``cutoff_ms``. ValueError if there is no such gap or ``points`` < 2.
- ``WEKA_TOOL_GAP_MS``: that table (101 points, ms) for the 710 real WEKA Claude Code
  sessions in ``data/traces/weka_claude_code`` converted by
  ``anchorage.trace.convert.weka`` (a request's ``think_time`` becomes the previous
  request's tool gap when that one stopped for ``tool_use``), with ``cutoff_ms`` = 30 min:
  41,743 of 41,895 tool gaps; the 152 longer ones (up to 10.4 h) are a human away, which
  the CacheWise paper's replay treats as a session boundary (section 6.1). Median 8 s,
  p90 68 s, p99 604 s, mean 35.5 s. The data has 1 s resolution. Reproduce with
  ``tool_gap_quantiles(weka.convert(path, ConvertOptions())[1], cutoff_ms=1.8e6)``
  (checked by ``tests/sim/test_gaps.py`` on a fixed sample).
- ``match_tool_gaps(records, quantiles) -> list[TraceRecord]``: rank-based quantile
  mapping. Of the n records with a tool gap, the k-th shortest (k = 0..n-1; ties keep
  record order) gets the target quantile at q = (k + 0.5) / n, linearly interpolated in
  ``quantiles`` (evenly spaced over [0, 1]), rounded to 0.1 ms. The map is monotone, so
  the order of gaps (which tool, which arguments take longer) is kept and ``tool_name`` /
  ``tool_args`` stay as predictive of the relative gap as before, while the marginal
  distribution becomes the target's. Records without a tool gap, and every other field,
  are unchanged; the input is not modified. ValueError on an empty or decreasing table.
- ``closed_loop_gaps_s(records, think_s=0.3)``: each request's true gap to its session's
  next request in the timed closed loop (the oracle's ``next_gap_s``).
- ``TOOL_GAPS``: named targets for the benchmarks: ``generator`` (None: keep the
  workload's own gaps) and ``weka``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

from anchorage.trace.format import TraceRecord

# p0..p100 of the WEKA Claude Code tool gaps <= 30 min (ms); see the module docstring.
WEKA_TOOL_GAP_MS: tuple[float, ...] = (
    0, 2000, 3000, 3000, 3000, 3000, 3000, 4000, 4000, 4000, 4000, 4000, 4000, 4000, 4000,
    4000, 4000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 5000, 6000,
    6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000, 7000, 7000, 7000, 7000, 7000, 7000,
    7000, 7000, 8000, 8000, 8000, 8000, 8000, 8000, 9000, 9000, 9000, 9000, 10000, 10000,
    10000, 10000, 11000, 11000, 11000, 12000, 12000, 12000, 13000, 13000, 14000, 14000,
    15000, 15000, 16000, 16000, 17000, 18000, 19000, 20000, 21000, 22000, 23000, 25000,
    27000, 29000, 32000, 35000, 38000, 41000, 47000, 53000, 63000, 68000, 78000, 96000,
    115000, 126000, 140000, 183000, 238000, 316000, 604000, 1795000)
WEKA_CUTOFF_MS = 1.8e6

TOOL_GAPS: dict[str, tuple[float, ...] | None] = {"generator": None, "weka": WEKA_TOOL_GAP_MS}


def _quantile(xs: Sequence[float], q: float) -> float:
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tool_gap_quantiles(records: Sequence[TraceRecord], points: int = 101,
                       cutoff_ms: float | None = None) -> list[float]:
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    xs = sorted(r.tool_duration_ms for r in records if r.tool_duration_ms is not None
                and (cutoff_ms is None or r.tool_duration_ms <= cutoff_ms))
    if not xs:
        raise ValueError("no tool gaps (tool_duration_ms) in the records")
    return [_quantile(xs, i / (points - 1)) for i in range(points)]


def match_tool_gaps(records: Sequence[TraceRecord],
                    quantiles: Sequence[float]) -> list[TraceRecord]:
    qs = [float(x) for x in quantiles]
    if len(qs) < 2:
        raise ValueError("a quantile table needs at least 2 points")
    if any(b < a for a, b in itertools.pairwise(qs)) or qs[0] < 0:
        raise ValueError("a quantile table must be non-negative and non-decreasing")
    idx = [i for i, r in enumerate(records) if r.tool_duration_ms is not None]
    idx.sort(key=lambda i: (records[i].tool_duration_ms, i))
    out = list(records)
    n = len(idx)
    for k, i in enumerate(idx):
        d = round(_quantile(qs, (k + 0.5) / n), 1)
        out[i] = dataclasses.replace(records[i], tool_duration_ms=d)
    return out


def closed_loop_gaps_s(records: Sequence[TraceRecord], think_s: float = 0.3) -> list[float]:
    """Per record (index = ``RequestContext.seq``): how long after it completes its
    session's next request arrives in the timed simulator's closed loop
    (``cluster.build_workload``): its ``tool_duration_ms`` in seconds, else ``think_s``;
    inf for a session's last request and for requests without a session. This is the
    ground truth ``cachewise-oracle`` takes as ``next_gap_s`` in the timed simulator."""
    out = [math.inf] * len(records)
    by_session: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        if r.session_id is not None:
            by_session.setdefault(r.session_id, []).append(i)
    for idx in by_session.values():
        idx.sort(key=lambda j: (records[j].timestamp, j))
        for a in idx[:-1]:
            d = records[a].tool_duration_ms
            out[a] = d / 1000.0 if d is not None else think_s
    return out
