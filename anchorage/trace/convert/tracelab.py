"""TraceLab round traces (``round_trace.jsonl``), by positional hashing.

Mapping
-------
* One line per model round: ``session_id``, ``round_index``, ``provider``,
  ``input_tokens_total``, ``prefix_tokens`` (the cached prefix), ``output_tokens``,
  ``timing_events[]`` (ISO timestamps), ``tools[]`` (``tool_name``,
  ``tool_wall_latency_ms``, ``emitted_at``, ``result_at``).
* Block ids are built from token positions (no text is released): round r of a session
  keeps the first ``min(prefix_tokens // B, len(previous blocks))`` block contents of the
  session's previous round and gets fresh contents after them; contents go through one
  ``PrefixIds``, so ids are chained. The cached prefix of a session's first round (the
  provider's system prompt and tools, cached by earlier sessions) is a per-provider anchor
  ``("anchor", provider, i)``, shared by all that provider's sessions. B defaults to 16.
* ``agent`` is the provider (``claude``, ``codex``); ``timestamp`` the round's first
  timing event, relative to the session's first round; sessions start at seeded uniform
  offsets over ``window_s`` (default 60 s).
* Tools run after the round: ``tool_name`` is the slowest tool's, ``tool_args``
  ``{"tools": [names...]}``, ``tool_duration_ms`` the tools' wall span (first
  ``emitted_at`` to last ``result_at``; else the largest ``tool_wall_latency_ms``).

``src`` is a ``round_trace.jsonl``, or a folder: ``sanitized/round_trace.jsonl`` under it
is preferred, else the only ``round_trace.jsonl`` found.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from anchorage.trace.blocks import PrefixIds, n_blocks
from anchorage.trace.convert.common import (ConvertOptions, interleave, iso_ms, read_json_objects,
                                            start_offsets_ms)
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord

DEFAULT_BLOCK_SIZE = 16
DEFAULT_WINDOW_S = 60.0


def _path(src: str) -> str:
    if not os.path.isdir(src):
        return src
    for cand in (os.path.join(src, "sanitized", "round_trace.jsonl"),
                 os.path.join(src, "example_sessions", "sanitized", "round_trace.jsonl")):
        if os.path.exists(cand):
            return cand
    found = sorted(glob.glob(os.path.join(src, "**", "round_trace.jsonl"), recursive=True))
    if len(found) != 1:
        raise TraceError(src, None, f"expected one round_trace.jsonl, found {len(found)}")
    return found[0]


def _int(obj: dict, key: str, path: str, line: int, default: Any = ...) -> int:
    v = obj.get(key, None if default is ... else default)
    if v is None and default is not ...:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TraceError(path, line, f"{key} must be an int >= 0, got {v!r}")
    return v


def _tools(tools: Any, path: str, line: int) -> tuple[str | None, Any, float | None]:
    if not tools:
        return None, None, None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise TraceError(path, line, "tools must be a list of objects")
    names = [str(t.get("tool_name")) for t in tools]
    lat = [t.get("tool_wall_latency_ms") if isinstance(t.get("tool_wall_latency_ms"),
                                                        (int, float)) else 0 for t in tools]
    slowest = max(range(len(tools)), key=lambda i: lat[i])
    try:
        starts = [iso_ms(t["emitted_at"]) for t in tools if t.get("emitted_at")]
        ends = [iso_ms(t["result_at"]) for t in tools if t.get("result_at")]
    except (ValueError, TypeError) as exc:
        raise TraceError(path, line, f"bad tool timestamp: {exc}") from None
    span = max(ends) - min(starts) if starts and ends and max(ends) >= min(starts) else None
    dur = span if span is not None else float(max(lat))
    return names[slowest], {"tools": names}, round(dur, 3)


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    path = _path(src)
    bs = opts.block_size or DEFAULT_BLOCK_SIZE
    rows = read_json_objects(path)

    by_session: dict[str, list[tuple[int, int, dict]]] = {}
    for line, obj in rows:
        sid = obj.get("session_id")
        if not isinstance(sid, str) or not sid:
            raise TraceError(path, line, "session_id must be a non-empty string")
        if sid not in by_session and opts.limit is not None and len(by_session) >= opts.limit:
            continue
        by_session.setdefault(sid, []).append((_int(obj, "round_index", path, line), line, obj))

    ids = PrefixIds()
    sessions: list[list[TraceRecord]] = []
    for sid, rounds in by_session.items():
        rounds.sort(key=lambda x: x[0])
        prev: list[Any] = []  # block contents of the previous round
        recs: list[TraceRecord] = []
        t0 = None
        for rnd, line, obj in rounds:
            total = _int(obj, "input_tokens_total", path, line)
            prefix = _int(obj, "prefix_tokens", path, line, default=0)
            out = _int(obj, "output_tokens", path, line, default=0)
            provider = str(obj.get("provider") or sid.split(":")[0])
            events = obj.get("timing_events") or []
            ts_text = next((e.get("timestamp") for e in events
                            if isinstance(e, dict) and e.get("timestamp")), None)
            if ts_text is None:
                raise TraceError(path, line, "round has no timing_events timestamp")
            try:
                ts = iso_ms(ts_text)
            except (ValueError, TypeError) as exc:
                raise TraceError(path, line, f"bad timestamp {ts_text!r}: {exc}") from None
            t0 = ts if t0 is None else t0
            nb = n_blocks(total, bs)
            keep = min(prefix, total) // bs
            if not recs:
                contents = [("anchor", provider, i) for i in range(keep)]
            else:
                contents = prev[:min(keep, len(prev))]
            contents += [(sid, rnd, i) for i in range(len(contents), nb)]
            name, args, dur = _tools(obj.get("tools"), path, line)
            recs.append(TraceRecord(timestamp=round(ts - t0, 3), hash_ids=ids.chain(contents),
                                    output_length=out, input_length=total, session_id=sid,
                                    agent=provider, tool_name=name, tool_args=args,
                                    tool_duration_ms=dur, extra={"prefix_tokens": prefix}))
            prev = contents
        sessions.append(recs)
    window = DEFAULT_WINDOW_S if opts.window_s is None else opts.window_s
    records = interleave(sessions, start_offsets_ms(len(sessions), window, opts.seed))
    header = TraceHeader(block_size=bs, source=f"tracelab:{os.path.basename(path)}",
                         has_header=True,
                         extra={"converter": "tracelab", "hash_kind": "positional",
                                "sessions": len(sessions), "window_s": window,
                                "seed": opts.seed})
    return header, records
