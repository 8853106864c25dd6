"""ChatDev multi-agent logs, derived common form (``derived/chatdev.jsonl.xz``).

Mapping
-------
* One line per LLM call: ``session_id``, ``agent`` (the role: CEO, Programmer, ...),
  ``ts`` (unix s, 1 s resolution), ``prompt_tokens``, ``output_tokens``, ``hash_ids``
  (16-token chained blocks rebuilt from the logged text), ``block_size`` (16),
  ``phase``, ``llm_latency_s``.
* ``agent`` is the role; ids (64-bit text hashes) are renumbered densely in order of
  first appearance (a bijection, so chained-prefix equality and the cross-session role
  prompts are kept).
* A call whose text was not recovered (``hash_ids`` null) gets fresh ids, one per
  ``prompt_tokens`` block: it counts as a request but shares nothing.
* ``input_length`` is ``prompt_tokens``, raised where needed to the least the rebuilt
  blocks need (``(len(hash_ids) - 1) * 16 + 1``: the rebuilt tokenizer is approximate);
  the logged count stays in ``prompt_tokens``.
* Time: sessions span 16 months and barely overlap. By default each session keeps its
  own relative timing and starts at a seeded uniform offset over ``window_s`` (default
  3600 s). With ``time_compression`` X the original clock is kept and divided by X
  instead (ms from the first call).

``src`` is ``chatdev.jsonl.xz``, or the dataset folder (``derived/chatdev.jsonl.xz``).
"""

from __future__ import annotations

import os

from anchorage.trace.blocks import n_blocks
from anchorage.trace.convert.common import (DEFAULT_WINDOW_S, ConvertOptions, interleave,
                                            read_json_objects,
                                            start_offsets_ms)
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord

BLOCK_SIZE = 16


def _path(src: str) -> str:
    if os.path.isdir(src):
        p = os.path.join(src, "derived", "chatdev.jsonl.xz")
        if not os.path.exists(p):
            raise TraceError(src, None, "no derived/chatdev.jsonl.xz in this folder")
        return p
    return src


def _int(obj: dict, key: str, path: str, line: int) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TraceError(path, line, f"{key} must be an int >= 0, got {v!r}")
    return v


def read_calls(path: str) -> list[tuple[int, dict]]:
    return read_json_objects(path)


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    path = _path(src)
    remap: dict[int, int] = {}
    by_session: dict[str, list[tuple[float, TraceRecord]]] = {}
    for line, obj in read_calls(path):
        sid = obj.get("session_id")
        if not isinstance(sid, str) or not sid:
            raise TraceError(path, line, "session_id must be a non-empty string")
        if sid not in by_session and opts.limit is not None and len(by_session) >= opts.limit:
            continue
        ts = obj.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            raise TraceError(path, line, f"ts must be a number, got {ts!r}")
        bs = obj.get("block_size")
        if bs not in (None, BLOCK_SIZE):
            raise TraceError(path, line, f"block_size {bs!r} (expected {BLOCK_SIZE})")
        prompt = _int(obj, "prompt_tokens", path, line)
        hids = obj.get("hash_ids")
        unmatched = hids is None
        if unmatched:  # text not recovered from the log: blocks known only by count
            hids = [("unmatched", line, i) for i in range(n_blocks(prompt, BLOCK_SIZE))]
        elif not isinstance(hids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hids):
            raise TraceError(path, line, "hash_ids must be a list of ints or null")
        out = _int(obj, "output_tokens", path, line)
        in_len = max(prompt, (len(hids) - 1) * BLOCK_SIZE + 1) if hids else prompt
        extra: dict = {"prompt_tokens": prompt}
        if unmatched:
            extra["unmatched_text"] = True
        if obj.get("phase") is not None:
            extra["phase"] = obj["phase"]
        if isinstance(obj.get("llm_latency_s"), (int, float)):
            extra["llm_latency_ms"] = round(obj["llm_latency_s"] * 1000.0, 3)
        agent = obj.get("agent")
        rec = TraceRecord(timestamp=0.0,
                          hash_ids=[remap.setdefault(h, len(remap)) for h in hids],
                          output_length=out, input_length=in_len, session_id=sid,
                          agent=None if agent is None else str(agent), extra=extra)
        by_session.setdefault(sid, []).append((float(ts), rec))

    sessions = list(by_session.values())
    for calls in sessions:
        calls.sort(key=lambda x: x[0])  # stable: same-second calls keep file order
    if opts.time_compression is not None:
        t0 = min((c[0][0] for c in sessions if c), default=0.0)
        flat = []
        for calls in sessions:
            for ts, rec in calls:
                rec.timestamp = round((ts - t0) * 1000.0 / opts.time_compression, 3)
                flat.append(rec)
        flat.sort(key=lambda r: r.timestamp)
        records, timing = flat, {"time_compression": opts.time_compression}
    else:
        window = DEFAULT_WINDOW_S if opts.window_s is None else opts.window_s
        rel = []
        for calls in sessions:
            start = calls[0][0]
            for ts, rec in calls:
                rec.timestamp = (ts - start) * 1000.0
            rel.append([rec for _, rec in calls])
        records = interleave(rel, start_offsets_ms(len(rel), window, opts.seed))
        timing = {"window_s": window, "seed": opts.seed}
    header = TraceHeader(block_size=BLOCK_SIZE, source="chatdev", has_header=True,
                         extra={"converter": "chatdev", "sessions": len(sessions), **timing})
    return header, records
