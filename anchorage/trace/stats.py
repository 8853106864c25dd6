"""Trace statistics (`anchorage trace stats`): size, sessions, agents, reuse.

* ``block_accesses``: sum of ``len(hash_ids)``; ``unique_blocks``: distinct block keys
  (keys are salted per tenant, as in the simulator: tenants share nothing).
* ``infinite_hit_rate``: block-weighted hit rate of an unbounded cache under the pool's
  hit rules (``anchorage.sim.replay.infinite_hit_rate``).
* Reuse distance of an access = LRU stack distance: the number of distinct blocks
  accessed since the previous access to the same block (first accesses have none and
  are counted as cold). A cache of C blocks under LRU hits exactly the accesses with
  distance < C. Computed exactly with a Fenwick tree over the positions of each block's
  latest access, O(n log n). On big traces it uses SHARDS spatial sampling (Waldspurger
  et al., FAST'15): only blocks whose key hash falls under rate R are tracked, and their
  distances are scaled by 1/R; R = sample / accesses (default sample 2,000,000).
  ``reuse_time_s`` is the time between the two accesses (same sampled set).
"""

from __future__ import annotations

import zlib
from typing import Any, Hashable, Iterable, Sequence

from anchorage.percentile import percentiles
from anchorage.sim.replay import infinite_hit_rate, make_contexts
from anchorage.trace.format import TraceReader

DEFAULT_SAMPLE = 2_000_000
_MASK = 0xFFFFFFFF


def _percentiles(values: list[float], qs: Sequence[float]) -> dict[str, float | None]:
    """``{"p50": ...}`` for ``qs`` in [0, 1] (``anchorage.percentile``); None for no values."""
    got = percentiles(values, [q * 100 for q in qs]) if values else [None] * len(qs)
    return {f"p{int(q * 100)}": v for q, v in zip(qs, got)}


class _Fenwick:
    __slots__ = ("n", "t")

    def __init__(self, n: int):
        self.n = n
        self.t = [0] * (n + 1)

    def add(self, i: int, d: int) -> None:
        i += 1
        t, n = self.t, self.n
        while i <= n:
            t[i] += d
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum over positions [0, i)."""
        s, t = 0, self.t
        while i > 0:
            s += t[i]
            i -= i & -i
        return s


def _key_hash(key: Hashable, salts: dict[Any, int]) -> int:
    if isinstance(key, int):
        return (key * 2654435761) & _MASK
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], int):
        s = salts.get(key[0])
        if s is None:
            s = salts[key[0]] = zlib.crc32(repr(key[0]).encode())
        return ((key[1] ^ s) * 2654435761) & _MASK
    return zlib.crc32(repr(key).encode())


def reuse_distances(accesses: Iterable[tuple[float, Sequence[Hashable]]], total: int,
                    sample: int = DEFAULT_SAMPLE) -> dict[str, Any]:
    """Stack distances (blocks) and reuse times (s) of ``(time_s, keys)`` accesses in
    order; ``total`` is the number of block accesses (sets the sampling rate)."""
    rate = 1.0 if total <= sample else sample / total
    threshold = int(rate * (_MASK + 1))
    salts: dict[Any, int] = {}
    seq: list[tuple[Hashable, float]] = []
    for t, keys in accesses:
        if rate >= 1.0:
            seq.extend((k, t) for k in keys)
        else:
            seq.extend((k, t) for k in keys if _key_hash(k, salts) < threshold)
    tree = _Fenwick(len(seq))
    last: dict[Hashable, tuple[int, float]] = {}
    dists: list[float] = []
    times: list[float] = []
    cold = 0
    for i, (k, t) in enumerate(seq):
        prev = last.get(k)
        if prev is None:
            cold += 1
        else:
            j, tj = prev
            d = tree.prefix(i) - tree.prefix(j + 1)
            dists.append(d if rate >= 1.0 else round(d / rate))
            times.append(round(t - tj, 6))
            tree.add(j, -1)
        tree.add(i, 1)
        last[k] = (i, t)
    qs = (0.5, 0.9, 0.99)
    return {
        "sample_rate": rate, "sampled_accesses": len(seq),
        "cold_fraction": cold / len(seq) if seq else 0.0,
        "reuse_distance_blocks": _percentiles(dists, qs),
        "reuse_time_s": _percentiles(times, qs),
    }


def trace_stats(path: str, *, lenient: bool = False, block_size: int | None = None,
                sample: int | None = None) -> dict[str, Any]:
    """All statistics of one trace as a JSON-ready dict (TraceError on a bad file)."""
    reader = TraceReader(path, lenient=lenient, block_size=block_size)
    records = list(reader)
    bs = reader.block_size
    contexts = make_contexts(records)
    sessions = {r.session_id for r in records if r.session_id is not None}
    agents = {r.agent for r in records if r.agent is not None}
    tenants = {r.tenant for r in records if r.tenant is not None}
    accesses = sum(len(c.keys) for c in contexts)
    unique = len({k for c in contexts for k in c.keys})
    n = len(records)
    reuse = reuse_distances(((c.now_s, c.keys) for c in contexts), accesses,
                            sample or DEFAULT_SAMPLE)
    return {
        "trace": path, "block_size": bs, "source": reader.header.source,
        "requests": n, "sessions": len(sessions), "agents": len(agents),
        "tenants": len(tenants),
        "agent_names": sorted(agents)[:50],
        "block_accesses": accesses, "unique_blocks": unique,
        "infinite_hit_rate": infinite_hit_rate(contexts, bs),
        "mean_input_tokens": sum(r.input_length for r in records) / n if n else 0.0,
        "mean_output_tokens": sum(r.output_length for r in records) / n if n else 0.0,
        "duration_s": (max(r.timestamp for r in records) - min(r.timestamp for r in records))
        / 1000.0 if n else 0.0,
        "tool_calls": sum(1 for r in records if r.tool_name is not None),
        "tool_durations": sum(1 for r in records if r.tool_duration_ms is not None),
        "skipped_lines": reader.skipped,
        **reuse,
    }


def format_stats(s: dict[str, Any]) -> str:
    def num(x: Any) -> str:
        if x is None:
            return "-"
        return f"{x:,.0f}" if isinstance(x, (int, float)) and abs(x) >= 100 else f"{x:.3g}"

    rd, rt = s["reuse_distance_blocks"], s["reuse_time_s"]
    rows = [
        ("trace", s["trace"]), ("block size", s["block_size"]),
        ("requests", f"{s['requests']:,}"), ("sessions", f"{s['sessions']:,}"),
        ("agents", f"{s['agents']:,}"), ("tenants", f"{s['tenants']:,}"),
        ("block accesses", f"{s['block_accesses']:,}"),
        ("unique blocks", f"{s['unique_blocks']:,}"),
        ("infinite-cache hit rate", f"{s['infinite_hit_rate']:.2%}"),
        ("mean input / output tokens",
         f"{s['mean_input_tokens']:,.0f} / {s['mean_output_tokens']:,.0f}"),
        ("duration", f"{s['duration_s']:,.1f} s"),
        ("tool calls / tool durations", f"{s['tool_calls']:,} / {s['tool_durations']:,}"),
        ("reuse distance p50/p90/p99 (blocks)",
         " / ".join(num(rd[k]) for k in ("p50", "p90", "p99"))),
        ("reuse time p50/p90/p99 (s)", " / ".join(num(rt[k]) for k in ("p50", "p90", "p99"))),
        ("cold accesses", f"{s['cold_fraction']:.2%}"
         + (f" (sampled at {s['sample_rate']:.3%})" if s["sample_rate"] < 1 else "")),
    ]
    if s["skipped_lines"]:
        rows.append(("skipped malformed lines", f"{s['skipped_lines']:,}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
