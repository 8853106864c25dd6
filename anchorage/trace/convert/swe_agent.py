"""SWE-agent trajectories (``.traj`` JSON, or ``trajectories.tar.xz`` of them), by text
hashing.

Mapping
-------
* Every ``assistant`` message of ``history`` is one LLM call; its prompt is every message
  before it, serialized as ``<|role|>`` + content. Text is split into approximate tokens
  (a GPT-2-style pre-tokenizer: words with their leading space, digit runs of <= 3,
  punctuation runs, whitespace), blocked by ``block_size`` (default 16), and given
  chained-prefix ids by one ``PrefixIds`` for the whole dataset: trajectories that share
  a system prompt and demonstration share those blocks (agent anchors).
  ``output_length`` is the reply's token count; ``agent`` the message's ``agent`` label.
* ``tool_name`` is the called function (``tool_calls``) or the action's first word
  (``open``, ``edit``, ``python``, ...); ``tool_args`` ``{"action": <first 200 chars>}``.
  ``tool_duration_ms`` is the matching ``trajectory`` step's measured ``execution_time``
  when there is one (39 of them in the public set).
* Time (the data has none): a call's successor starts after the estimated service time
  (``anchorage.trace.generate.service_ms``) plus the measured tool time, or 1 s when
  none was measured. Sessions start at seeded uniform offsets over ``window_s``
  (default 300 s).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from typing import Any, Iterator

from anchorage.trace.blocks import ROOT, PrefixIds
from anchorage.trace.convert.common import (ConvertOptions, interleave, load_json,
                                            start_offsets_ms)
from anchorage.trace.format import TraceError, TraceHeader, TraceRecord
from anchorage.trace.generate import service_ms

DEFAULT_BLOCK_SIZE = 16
DEFAULT_WINDOW_S = 300.0
DEFAULT_STEP_MS = 1000.0
_TOKEN = re.compile(r" ?[A-Za-z]+| ?\d{1,3}| ?[^\sA-Za-z\d]+|\s+")
_TOOL_NAME = re.compile(r"""['"]name['"]\s*:\s*['"]([\w.\-]+)['"]""")


def tokenize(text: str) -> list[str]:
    """Approximate LLM tokens of a text (close to BPE counts for English and code)."""
    return _TOKEN.findall(text)


def trajectories(src: str) -> Iterator[tuple[str, Any]]:
    """(name, parsed JSON) of each trajectory in a tar(.xz), a folder or one file."""
    if os.path.isdir(src):
        for name in sorted(os.listdir(src)):
            if name.endswith(".traj"):
                p = os.path.join(src, name)
                yield p, load_json(p)
        return
    if src.endswith(".traj") or src.endswith(".json"):
        yield src, load_json(src)
        return
    try:
        with tarfile.open(src, "r:*") as tar:
            members = sorted((m for m in tar.getmembers()
                              if m.isfile() and m.name.endswith(".traj")), key=lambda m: m.name)
            for m in members:
                fh = tar.extractfile(m)
                where = f"{src}!{m.name}"
                try:
                    doc = json.loads(fh.read().decode("utf-8")) if fh else None
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise TraceError(where, None, f"invalid JSON: {exc}") from None
                yield where, doc
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise TraceError(src, None, f"cannot read as a tar of .traj files: {exc}") from None


def _tool(msg: dict) -> tuple[str | None, str]:
    action = msg.get("action")
    action = action.strip() if isinstance(action, str) else ""
    calls = msg.get("tool_calls")
    if calls:
        m = _TOOL_NAME.search(calls if isinstance(calls, str) else json.dumps(calls))
        if m:
            return m.group(1), action
    return (action.split()[0] if action else None), action


def convert_trajectory(where: str, doc: Any, ids: PrefixIds, bs: int) -> list[TraceRecord]:
    if not isinstance(doc, dict) or not isinstance(doc.get("history"), list):
        raise TraceError(where, None, "expected an object with a 'history' list")
    steps = doc.get("trajectory") or []
    sid = os.path.basename(where.split("!")[-1]).rsplit(".", 1)[0]
    tokens: list[str] = []
    chain: list[int] = []
    records: list[TraceRecord] = []
    step = 0
    t = 0.0
    for i, msg in enumerate(doc["history"]):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise TraceError(where, None, f"history[{i}]: expected an object with a role")
        content = msg.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p)
                              for p in content)
        text_tokens = [f"<|{msg['role']}|>"] + tokenize(content if isinstance(content, str)
                                                        else json.dumps(content))
        if msg["role"] == "assistant":
            for b in range(len(chain), len(tokens) // bs):
                chain.append(ids.child(chain[-1] if chain else ROOT,
                                       tuple(tokens[b * bs:(b + 1) * bs])))
            hids = list(chain)
            if len(tokens) % bs:
                hids.append(ids.child(hids[-1] if hids else ROOT,
                                      tuple(tokens[len(chain) * bs:])))
            name, action = _tool(msg)
            dur = None
            if step < len(steps) and isinstance(steps[step], dict):
                st = steps[step]
                same = str(st.get("action", "")).strip() == action
                et = st.get("execution_time")
                if same and isinstance(et, (int, float)) and not isinstance(et, bool):
                    dur = round(et * 1000.0, 3)
            step += 1
            rec = TraceRecord(timestamp=round(t, 3), hash_ids=hids,
                              output_length=len(text_tokens) - 1, input_length=len(tokens),
                              session_id=sid, agent=str(msg.get("agent") or "swe-agent"),
                              tool_name=name,
                              tool_args={"action": action[:200]} if name else None,
                              tool_duration_ms=dur)
            records.append(rec)
            t += service_ms(rec.input_length, rec.output_length) + (
                dur if dur is not None else DEFAULT_STEP_MS)
        tokens.extend(text_tokens)
    return records


def convert(src: str, opts: ConvertOptions) -> tuple[TraceHeader, list[TraceRecord]]:
    bs = opts.block_size or DEFAULT_BLOCK_SIZE
    ids = PrefixIds()
    sessions = []
    for where, doc in trajectories(src):
        if opts.limit is not None and len(sessions) >= opts.limit:
            break
        recs = convert_trajectory(where, doc, ids, bs)
        if recs:
            sessions.append(recs)
    if not sessions:
        raise TraceError(src, None, "no trajectories with assistant messages found")
    window = DEFAULT_WINDOW_S if opts.window_s is None else opts.window_s
    records = interleave(sessions, start_offsets_ms(len(sessions), window, opts.seed))
    header = TraceHeader(block_size=bs, source="swe_agent", has_header=True,
                         extra={"converter": "swe-agent", "hash_kind": "text",
                                "sessions": len(sessions), "window_s": window,
                                "seed": opts.seed})
    return header, records
