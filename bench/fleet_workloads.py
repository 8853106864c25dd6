"""The fleet benchmark's workloads: records, contexts and the block size to simulate them at.

- ``weka``: real WEKA Claude Code sessions (``data/traces/weka_claude_code``, 710
  sessions), ``n`` sampled with the seed (all 710 when ``n`` >= 710, in seeded order),
  their own prompts, outputs and tool gaps (``anchorage.trace.convert.weka``; gaps above
  30 min, a human away, capped at 30 min as the CacheWise paper treats them as session
  boundaries). Simulated at ``64 x merge``-token blocks: every ``merge`` consecutive
  64-token hash ids become one block keyed by the last of them (ids are chained, so the
  key still stands for its whole prefix); ``merge`` 4 (256-token blocks) cuts the pool's
  work per request fourfold and loses at most 255 tokens of prefix hit per request
  (0.2 % of the mean 122k-token prompt).
- ``swe``: the 22 SWE-agent trajectories (``data/traces/swe_agent``), converted with
  their measured tool times (39 of the calls); a call without a measurement gets the
  median measured time of its tool, else of all tools. ``n`` sessions are drawn from the
  22 with the seed; each copy keeps the blocks the trajectories share (system prompt and
  demonstration: ids seen in two or more trajectories) and salts its own, so copies
  share anchors but not histories. 16-token blocks.
- ``gen``: the generator's ``selector`` topology (6 agents, ``n`` sessions, the seed),
  tool durations mapped onto the WEKA tool-gap distribution (``anchorage.sim.gaps``),
  64-token blocks (the generator's 16-token ids coarsened by 4, as for WEKA).
- ``mooncake``: the Mooncake conversation trace as released (12,031 requests, no
  sessions, 512-token blocks), open loop; load is the arrival rate (``time_scale``).

``load(name, n, seed)`` -> ``(records, contexts, block_size)``; memoised per process.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from typing import Any

from anchorage.sim.gaps import WEKA_TOOL_GAP_MS, match_tool_gaps
from anchorage.sim.replay import make_contexts
from anchorage.workloads import trace_path

WORKLOADS = ("weka", "swe", "gen", "mooncake")
MAX_TOOL_GAP_MS = 1.8e6
WEKA_MERGE = 4
_CACHE: dict = {}


def _weka_sessions() -> list[tuple[str, Any]]:
    if "weka_files" not in _CACHE:
        from anchorage.trace.convert.weka import session_files
        _CACHE["weka_files"] = session_files(str(trace_path("weka_claude_code")))
    return _CACHE["weka_files"]


def coarsen(ids: list, merge: int) -> list:
    """Every ``merge`` consecutive chained ids as one id (the last of each group)."""
    if merge == 1:
        return list(ids)
    return [ids[min(i + merge, len(ids)) - 1] for i in range(0, len(ids), merge)]


def weka(n: int, seed: int, merge: int = WEKA_MERGE):
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import convert_session

    files = _weka_sessions()
    pick = random.Random(seed).sample(files, min(n, len(files)))
    next_id = [0]
    recs = []
    for k, path in enumerate(pick):
        session = convert_session(path, load_json(path), next_id)
        base = session[0].timestamp
        for r in session:
            gap = r.tool_duration_ms
            if gap is not None and gap > MAX_TOOL_GAP_MS:
                gap = MAX_TOOL_GAP_MS
            recs.append(dataclasses.replace(
                r, timestamp=k * 1000.0 + (r.timestamp - base) * 1e-6, tool_duration_ms=gap,
                hash_ids=coarsen(r.hash_ids, merge)))
    recs.sort(key=lambda r: r.timestamp)
    return recs, 64 * merge


def _swe_templates():
    if "swe" not in _CACHE:
        from anchorage.trace.convert.common import ConvertOptions
        from anchorage.trace.convert.swe_agent import convert
        _, recs = convert(str(trace_path("swe_agent/trajectories.tar.xz")),
                          ConvertOptions())
        measured = [r.tool_duration_ms for r in recs if r.tool_duration_ms is not None]
        by_tool: dict = {}
        for r in recs:
            if r.tool_duration_ms is not None:
                by_tool.setdefault(r.tool_name, []).append(r.tool_duration_ms)
        med = statistics.median(measured)
        sessions: dict = {}
        for r in recs:
            d = r.tool_duration_ms
            if d is None and r.tool_name is not None:
                d = statistics.median(by_tool[r.tool_name]) if r.tool_name in by_tool else med
            sessions.setdefault(r.session_id, []).append(
                dataclasses.replace(r, tool_duration_ms=d))
        owners: dict = {}
        for sid, rs in sessions.items():
            for r in rs:
                for h in r.hash_ids:
                    owners.setdefault(h, set()).add(sid)
        shared = {h for h, s in owners.items() if len(s) > 1}
        _CACHE["swe"] = (list(sessions.values()), shared)
    return _CACHE["swe"]


def swe(n: int, seed: int):
    templates, shared = _swe_templates()
    rng = random.Random(seed)
    recs = []
    for k in range(n):
        tpl = templates[rng.randrange(len(templates))]
        base = tpl[0].timestamp
        sid = f"{tpl[0].session_id}#{k}"
        for r in tpl:
            ids = [h if h in shared else ("c", k, h) for h in r.hash_ids]
            recs.append(dataclasses.replace(r, session_id=sid, hash_ids=ids,
                                            timestamp=k * 1000.0 + (r.timestamp - base)))
    recs.sort(key=lambda r: r.timestamp)
    return recs, 16


def gen(n: int, seed: int, topology: str = "selector", merge: int = 4):
    from anchorage.trace.generate import generate
    _, recs = generate(topology, 6, n, seed, concurrency=64.0)
    recs = [dataclasses.replace(r, hash_ids=coarsen(r.hash_ids, merge))
            for r in match_tool_gaps(recs, WEKA_TOOL_GAP_MS)]
    return recs, 16 * merge


def mooncake(n: int, seed: int):
    from anchorage.trace.convert.common import ConvertOptions
    from anchorage.trace.convert.mooncake import convert
    _, recs = convert(str(trace_path("mooncake/conversation_trace.jsonl.xz")),
                      ConvertOptions())
    return recs, 512


def load(name: str, n: int, seed: int):
    key = (name, n, seed)
    if key not in _CACHE:
        fn = {"weka": weka, "swe": swe, "gen": gen, "mooncake": mooncake}.get(name)
        if fn is None:
            raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
        recs, bs = fn(n, seed)
        _CACHE[key] = (recs, make_contexts(recs), bs)
    recs, ctxs, bs = _CACHE[key]
    return recs, ctxs, bs
