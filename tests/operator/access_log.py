"""A recorded access log (anchorage-trace/v1) on which default policy parameters are poor.

Four long-lived sessions take a turn every ``gap_s`` seconds (8 anchor blocks plus a growing
history); between turns a stream of one-shot requests with fresh prompts floods the cache.
Under LRU (or a TTL shorter than the gap) every session's blocks are evicted before its next
turn; a TTL longer than the gap keeps them, and so does hybrid once it has learned the gap,
unless a survival threshold (e.g. the example policy's 0.3) marks the waiting sessions
low-survival.
"""

from __future__ import annotations

from pathlib import Path

from anchorage.trace.format import TraceHeader, TraceRecord, write_trace


def write_access_log(path: Path, *, sessions: int = 4, turns: int = 12, gap_s: float = 2.0,
                     noise_per_gap: int = 20, block_size: int = 16) -> Path:
    recs: list[TraceRecord] = []
    next_id = 10_000
    history = {s: list(range(s * 100, s * 100 + 8)) for s in range(sessions)}
    t_ms = 0.0
    for turn in range(turns):
        for s in range(sessions):
            h = history[s]
            h.append(s * 100 + 8 + turn)  # this turn's new history block
            recs.append(TraceRecord(timestamp=t_ms, hash_ids=list(h), output_length=4,
                                    input_length=len(h) * block_size, session_id=f"s{s}"))
            t_ms += 10
        step = gap_s * 1000 / (noise_per_gap + 1)
        for _ in range(noise_per_gap):
            t_ms += step
            ids = list(range(next_id, next_id + 6))
            next_id += 6
            recs.append(TraceRecord(timestamp=round(t_ms, 3), hash_ids=ids, output_length=4,
                                    input_length=6 * block_size))
    write_trace(path, recs, header=TraceHeader(block_size=block_size, source="test access log"))
    return path
