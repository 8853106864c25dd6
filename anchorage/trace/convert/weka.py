"""WEKA Claude Code traces (kv-cache-tester): one xz JSON per session.

Mapping
-------
* A session file: ``id``, ``block_size`` (64), ``hash_id_scope`` ("local"),
  ``requests[]``. Local ids are renumbered per session (``(session, id) -> global id``, in
  order of first appearance), so two sessions never collide and, as in the data, share
  nothing (the common system prompt is invisible: ``hash_id_scope`` is local).
* Main-agent requests (``type`` ``n`` or ``s``) get ``agent = "main"``. A ``subagent``
  record is a run of a sub-agent: its ``t`` is when it returned, it started
  ``duration_ms`` earlier, and its nested ``requests`` (``t`` from the sub-agent's start)
  become requests with ``agent = "subagent:<subagent_type>"`` in the same session and id
  namespace (sub-agents share the parent's namespace, as in the data).
* ``think_time`` of a request (the client-side gap before it: tool plus user time) becomes
  ``tool_duration_ms`` of the previous request of the same agent run when that one stopped
  for a tool (``stop == "tool_use"``); otherwise it is kept as ``think_ms``. The main
  request that was followed by a sub-agent launch is labelled ``tool_name = "Task"`` with
  ``tool_args = {"subagent_type": ...}``. The data has no other tool names.
* ``in``/``out`` are ``input_length``/``output_length``; ``api_time`` is kept as
  ``api_time_ms``.
* Sessions keep their own timing and start at seeded uniform offsets over ``window_s``
  (default 3600 s), so they interleave on one clock.

``src`` is the dataset folder, its ``traces/`` folder, or one session file.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from anchorage.trace.convert.common import (DEFAULT_WINDOW_S, ConvertOptions, interleave,
                                            load_json, start_offsets_ms)
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord

BLOCK_SIZE = 64


def session_files(src: str) -> list[str]:
    if os.path.isfile(src):
        return [src]
    folder = os.path.join(src, "traces") if os.path.isdir(os.path.join(src, "traces")) else src
    files = sorted(glob.glob(os.path.join(folder, "*.json.xz")) +
                   glob.glob(os.path.join(folder, "*.json")))
    if not files:
        raise TraceError(src, None, "no session files (*.json.xz) found")
    return files


def _num(r: dict, key: str, path: str, where: str, default: Any = None) -> Any:
    v = r.get(key, default)
    if v is None and default is None and key not in r:
        raise TraceError(path, None, f"{where}: missing field {key!r}")
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise TraceError(path, None, f"{where}: field {key!r} must be a number, got {v!r}")
    return v


class _Session:
    def __init__(self, path: str, sid: str):
        self.path, self.sid = path, sid
        self.remap: dict[int, int] = {}
        self.records: list[TraceRecord] = []

    def ids(self, local: Any, where: str, next_id: list[int]) -> list[int]:
        if not isinstance(local, list):
            raise TraceError(self.path, None, f"{where}: hash_ids must be a list of ints")
        try:
            out = list(map(self.remap.get, local))  # fast path: ids seen before (validated)
        except TypeError:  # an unhashable element
            raise TraceError(self.path, None, f"{where}: hash_ids must be a list of ints") from None
        if None in out:
            for i, h in enumerate(local):
                if out[i] is None:
                    if not isinstance(h, int) or isinstance(h, bool):
                        raise TraceError(self.path, None,
                                         f"{where}: hash_ids must be a list of ints")
                    g = self.remap.get(h)
                    if g is None:
                        g = self.remap[h] = next_id[0]
                        next_id[0] += 1
                    out[i] = g
        return out

    def run(self, requests: list, agent: str, t0_s: float, where: str,
            next_id: list[int]) -> list[tuple[TraceRecord, dict]]:
        """Records of one agent run (main or a sub-agent), in order."""
        out: list[tuple[TraceRecord, dict]] = []
        for i, r in enumerate(requests):
            w = f"{where} request {i}"
            if not isinstance(r, dict):
                raise TraceError(self.path, None, f"{w}: expected an object")
            if r.get("type") == "subagent":
                continue
            t = _num(r, "t", self.path, w)
            in_len = _num(r, "in", self.path, w)
            out_len = _num(r, "out", self.path, w)
            hids = self.ids(r.get("hash_ids"), w, next_id)
            extra = {}
            if r.get("api_time") is not None:
                extra["api_time_ms"] = round(_num(r, "api_time", self.path, w) * 1000.0, 3)
            rec = TraceRecord(timestamp=(t0_s + t) * 1000.0, hash_ids=hids,
                              output_length=int(out_len), input_length=int(in_len),
                              session_id=self.sid, agent=agent, extra=extra)
            if hids and rec.input_length <= (len(hids) - 1) * BLOCK_SIZE:
                raise TraceError(self.path, None,
                                 f"{w}: in={in_len} is too short for {len(hids)} blocks")
            out.append((rec, r))
        for (prev, prev_raw), (_, raw) in zip(out, out[1:]):
            think = raw.get("think_time")
            if isinstance(think, (int, float)) and not isinstance(think, bool) and think >= 0:
                if prev_raw.get("stop") == "tool_use":
                    prev.tool_duration_ms = round(think * 1000.0, 3)
                else:
                    prev.extra["think_ms"] = round(think * 1000.0, 3)
        return out


def convert_session(path: str, doc: Any, next_id: list[int]) -> list[TraceRecord]:
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise TraceError(path, None, "expected an object with a 'requests' list")
    bs = doc.get("block_size", BLOCK_SIZE)
    if bs != BLOCK_SIZE:
        raise TraceError(path, None, f"block_size {bs!r} differs from the dataset's {BLOCK_SIZE}")
    sid = str(doc.get("id") or os.path.basename(path).split(".")[0])
    sess = _Session(path, sid)
    main = sess.run(doc["requests"], "main", 0.0, "main", next_id)
    records = [r for r, _ in main]
    for i, r in enumerate(doc["requests"]):
        if not isinstance(r, dict) or r.get("type") != "subagent":
            continue
        w = f"subagent {r.get('agent_id', i)}"
        end = _num(r, "t", sess.path, w)
        dur = _num(r, "duration_ms", sess.path, w, default=0) or 0
        start = end - dur / 1000.0
        kind = str(r.get("subagent_type") or "unknown")
        inner = r.get("requests") or []
        if not isinstance(inner, list):
            raise TraceError(path, None, f"{w}: requests must be a list")
        records += [x for x, _ in sess.run(inner, f"subagent:{kind}", start, w, next_id)]
        launcher = None
        for rec, raw in main:  # the main request after which the sub-agent was launched
            if rec.timestamp <= start * 1000.0 + 1e-6:
                launcher = (rec, raw)
        if launcher is not None and launcher[1].get("stop") == "tool_use":
            launcher[0].tool_name = "Task"
            launcher[0].tool_args = {"subagent_type": kind}
    records.sort(key=lambda x: x.timestamp)
    return records


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    files = session_files(src)
    if opts.limit is not None:
        files = files[: opts.limit]
    next_id = [0]
    sessions = [convert_session(f, load_json(f), next_id) for f in files]
    window = DEFAULT_WINDOW_S if opts.window_s is None else opts.window_s
    records = interleave(sessions, start_offsets_ms(len(sessions), window, opts.seed))
    header = TraceHeader(block_size=BLOCK_SIZE, source="weka_claude_code", has_header=True,
                         extra={"converter": "weka", "seed": opts.seed, "window_s": window,
                                "sessions": len(sessions)})
    return header, records
