"""Dataset converters into anchorage-trace/v1, on small fixtures written here that mimic
each dataset's schema, plus one check per converter on the real file (data/traces,
committed: a missing one fails)."""

from __future__ import annotations

import io
import json
import lzma
import tarfile

import pytest

from anchorage.cli import main
from anchorage.trace.convert import CONVERTERS, ConvertOptions, convert
from anchorage.trace.format import TraceError, TraceReader, read_trace, write_trace
from tests.conftest import repo_trace


def _xz_json(path, obj):
    path.write_bytes(lzma.compress(json.dumps(obj).encode()))


def _valid(tmp_path, header, records):
    """Write and re-read through the validating reader (time order checked)."""
    out = tmp_path / "out.jsonl"
    write_trace(out, records, header)
    return list(TraceReader(out, check_order=True))


def _by_session(records):
    out = {}
    for r in records:
        out.setdefault(r.session_id, []).append(r)
    return out


# ---------------------------------------------------------------------------------------
# Mooncake

def test_mooncake(tmp_path):
    src = tmp_path / "mc.jsonl.xz"
    lines = [{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
             {"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [0, 2]},
             {"timestamp": 9, "input_length": 100, "output_length": 5, "hash_ids": [3]}]
    src.write_bytes(lzma.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    header, recs = convert("mooncake", src)
    assert header.block_size == 512 and header.source == "mooncake:mc.jsonl.xz"
    assert [r.timestamp for r in recs] == [0, 5, 9] and recs[0].hash_ids == [0, 2]
    assert len(_valid(tmp_path, header, recs)) == 3
    assert len(convert("mooncake", src, ConvertOptions(limit=2))[1]) == 2


def test_mooncake_bad_line(tmp_path):
    src = tmp_path / "mc.jsonl"
    src.write_text('{"timestamp": 0, "hash_ids": [1], "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match=r"mc.jsonl:2: missing required field 'hash_ids'"):
        convert("mooncake", src)


# ---------------------------------------------------------------------------------------
# WEKA Claude Code

def _weka_session(sid, with_subagent=False):
    reqs = [
        {"t": 0.0, "type": "n", "in": 200, "out": 10, "hash_ids": [1, 2, 3], "stop": "tool_use",
         "api_time": 2.0, "think_time": 0.0},
        {"t": 10.0, "type": "n", "in": 300, "out": 20, "hash_ids": [1, 2, 3, 4],
         "stop": "end_turn", "api_time": 3.0, "think_time": 8.0},
        {"t": 60.0, "type": "s", "in": 330, "out": 5, "hash_ids": [1, 2, 3, 4, 5],
         "stop": "tool_use", "api_time": 1.0, "think_time": 47.0},
    ]
    if with_subagent:
        reqs.append({"t": 100.0, "type": "subagent", "agent_id": "agent_001",
                     "subagent_type": "Explore", "duration_ms": 30000, "tool_use_count": 2,
                     "requests": [
                         {"t": 0.0, "type": "n", "in": 130, "out": 7, "hash_ids": [90, 91],
                          "stop": "tool_use", "api_time": 1.0, "think_time": 0.0},
                         {"t": 5.0, "type": "n", "in": 200, "out": 7, "hash_ids": [90, 91, 92],
                          "stop": "end_turn", "api_time": 1.0, "think_time": 3.5}]})
        reqs.append({"t": 110.0, "type": "n", "in": 400, "out": 9,
                     "hash_ids": [1, 2, 3, 4, 5, 6], "stop": "end_turn", "api_time": 2.0,
                     "think_time": 49.0})
    return {"id": sid, "models": ["m"], "block_size": 64, "hash_id_scope": "local",
            "tool_tokens": 100, "system_tokens": 50, "requests": reqs}


@pytest.fixture
def weka_dir(tmp_path):
    d = tmp_path / "weka" / "traces"
    d.mkdir(parents=True)
    _xz_json(d / "trace_0001.json.xz", _weka_session("trace_0001", with_subagent=True))
    _xz_json(d / "trace_0002.json.xz", _weka_session("trace_0002"))
    return d.parent


def test_weka(tmp_path, weka_dir):
    header, recs = convert("weka", weka_dir, ConvertOptions(seed=1, window_s=1000))
    assert header.block_size == 64 and header.extra["sessions"] == 2
    assert len(_valid(tmp_path, header, recs)) == len(recs) == 3 + 6
    s1, s2 = (_by_session(recs)[k] for k in ("trace_0001", "trace_0002"))
    # local ids never collide across sessions, and are consistent within one
    assert not set(h for r in s1 for h in r.hash_ids) & set(h for r in s2 for h in r.hash_ids)
    main1 = [r for r in s1 if r.agent == "main"]
    assert main1[1].hash_ids[:3] == main1[0].hash_ids
    sub = [r for r in s1 if r.agent == "subagent:Explore"]
    assert len(sub) == 2 and sub[1].hash_ids[:2] == sub[0].hash_ids
    # sub-agent requests start duration_ms before the record's t (when it returned)
    start = main1[0].timestamp  # session offset (t = 0)
    assert sub[0].timestamp - start == pytest.approx(70_000)
    assert sub[1].timestamp - start == pytest.approx(75_000)
    # think_time of the next request = tool time of a request that stopped for a tool
    assert main1[0].tool_duration_ms == 8000 and main1[1].tool_duration_ms is None
    assert main1[1].extra["think_ms"] == 47000
    assert sub[0].tool_duration_ms == 3500
    assert main1[2].tool_name == "Task" and main1[2].tool_args == {"subagent_type": "Explore"}
    assert main1[2].tool_duration_ms == 49000
    assert main1[0].extra["api_time_ms"] == 2000


def test_weka_interleaving_is_seeded(weka_dir):
    def starts(seed, window):
        recs = convert("weka", weka_dir, ConvertOptions(seed=seed, window_s=window))[1]
        return {sid: rs[0].timestamp for sid, rs in _by_session(recs).items()}
    assert starts(3, 5000) == starts(3, 5000)
    assert starts(3, 5000) != starts(4, 5000)
    assert all(v == 0 for v in starts(3, 0).values())  # window 0: all start together


def test_weka_single_file_and_limit(weka_dir):
    f = weka_dir / "traces" / "trace_0002.json.xz"
    assert len(convert("weka", f)[1]) == 3
    recs = convert("weka", weka_dir, ConvertOptions(limit=1))[1]
    assert {r.session_id for r in recs} == {"trace_0001"}


@pytest.mark.parametrize("mutate,problem", [
    (lambda d: d.update(requests=None), "'requests' list"),
    (lambda d: d["requests"][1].pop("in"), "main request 1: missing field 'in'"),
    (lambda d: d["requests"][0].update(hash_ids="x"), "main request 0: hash_ids must be"),
    (lambda d: d["requests"][0].update(hash_ids=[1, [2]]), "main request 0: hash_ids must be"),
    (lambda d: d["requests"][1].update(hash_ids=[1, 2.5]), "main request 1: hash_ids must be"),
    (lambda d: d["requests"][2].update(t="soon"), "main request 2: field 't' must be a number"),
    (lambda d: d.update(block_size=16), "block_size 16 differs"),
    (lambda d: d["requests"][0].update(**{"in": 10}), "in=10 is too short for 3 blocks"),
])
def test_weka_bad_session(tmp_path, mutate, problem):
    doc = _weka_session("trace_0009")
    mutate(doc)
    f = tmp_path / "trace_0009.json.xz"
    _xz_json(f, doc)
    with pytest.raises(TraceError, match=problem) as exc:
        convert("weka", f)
    assert exc.value.path == str(f)


def test_weka_corrupt_file(tmp_path):
    f = tmp_path / "trace_0001.json.xz"
    f.write_bytes(lzma.compress(b'{"id": "x", "requests": [')[:-8])
    with pytest.raises(TraceError, match="cannot read|invalid JSON"):
        convert("weka", f)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no session files"):
        convert("weka", tmp_path / "empty")


# ---------------------------------------------------------------------------------------
# ChatDev

BIG = 2 ** 63 + 12345


def _chatdev_lines():
    role = [BIG, BIG + 1, BIG + 2]  # a role prompt: same chained blocks in every session
    rows = []
    for s, t0 in (("A", 1_692_000_000), ("B", 1_700_000_000)):
        rows += [
            {"dataset": "chatdev", "session_id": s, "agent": "CEO", "ts": t0, "prompt_tokens": 40,
             "output_tokens": 5, "hash_ids": role, "block_size": 16, "hash_kind": "text",
             "llm_latency_s": 2.0, "phase": "DemandAnalysis"},
            {"dataset": "chatdev", "session_id": s, "agent": "Programmer", "ts": t0 + 30,
             "prompt_tokens": 80, "output_tokens": 50, "hash_ids": role + [hash(s) % 1000 + 7],
             "block_size": 16, "hash_kind": "text", "llm_latency_s": 9.0, "phase": "Coding"},
        ]
    rows.append({"dataset": "chatdev", "session_id": "B", "agent": "unmatched",
                 "ts": 1_700_000_050, "prompt_tokens": 33, "output_tokens": 4, "hash_ids": None,
                 "block_size": None, "hash_kind": None, "llm_latency_s": None, "phase": None})
    return rows


@pytest.fixture
def chatdev_file(tmp_path):
    d = tmp_path / "chatdev" / "derived"
    d.mkdir(parents=True)
    f = d / "chatdev.jsonl.xz"
    f.write_bytes(lzma.compress("".join(json.dumps(r) + "\n" for r in _chatdev_lines()).encode()))
    return f


def test_chatdev_window(tmp_path, chatdev_file):
    header, recs = convert("chatdev", chatdev_file.parent.parent, ConvertOptions(window_s=600))
    assert header.block_size == 16 and len(_valid(tmp_path, header, recs)) == 5
    a, b = (_by_session(recs)[k] for k in "AB")
    assert [r.agent for r in a] == ["CEO", "Programmer"]
    assert a[0].hash_ids == b[0].hash_ids == [0, 1, 2]  # dense, shared role prompt
    assert a[1].hash_ids[:3] == [0, 1, 2] and a[1].hash_ids[3] != b[1].hash_ids[3]
    assert a[1].timestamp - a[0].timestamp == 30_000
    assert max(r.timestamp for r in recs) < 600_000 + 60_000
    assert a[0].input_length == 40 and a[1].input_length == 80
    assert a[1].extra["phase"] == "Coding" and a[1].extra["llm_latency_ms"] == 9000
    unmatched = b[-1]
    assert unmatched.agent == "unmatched" and unmatched.extra["unmatched_text"]
    assert len(unmatched.hash_ids) == 3 and not set(unmatched.hash_ids) & {
        h for r in recs[:-1] for h in r.hash_ids if r is not unmatched}


def test_chatdev_time_compression(chatdev_file):
    _, recs = convert("chatdev", chatdev_file, ConvertOptions(time_compression=1000))
    ts = {(r.session_id, r.agent): r.timestamp for r in recs}
    assert ts[("A", "CEO")] == 0 and ts[("A", "Programmer")] == 30
    assert ts[("B", "CEO")] == pytest.approx(8_000_000)  # 8e6 s / 1000 in ms


def test_chatdev_input_length_clamped_to_blocks(tmp_path):
    row = _chatdev_lines()[1] | {"prompt_tokens": 20}  # 4 blocks cannot hold 20 tokens
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(row) + "\n")
    rec = convert("chatdev", f)[1][0]
    assert rec.input_length == 49 and rec.extra["prompt_tokens"] == 20


@pytest.mark.parametrize("row,problem", [
    ({"session_id": None}, "session_id must be"),
    ({"ts": "x"}, "ts must be a number"),
    ({"prompt_tokens": -1}, "prompt_tokens must be"),
    ({"hash_ids": [1, "a"]}, "hash_ids must be a list"),
    ({"block_size": 64}, "block_size 64"),
])
def test_chatdev_bad_line(tmp_path, row, problem):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps(_chatdev_lines()[0]) + "\n"
                 + json.dumps(_chatdev_lines()[0] | row) + "\n")
    with pytest.raises(TraceError, match=f"c.jsonl:2: {problem}"):
        convert("chatdev", f)


# ---------------------------------------------------------------------------------------
# SWE-agent

SYSTEM = "SETTING: You are an autonomous programmer. " * 20


def _traj(issue, timed):
    hist = [{"role": "system", "content": SYSTEM, "agent": "primary"},
            {"role": "user", "content": f"ISSUE: {issue} " * 10, "agent": "primary"}]
    steps = []
    for k in range(3):
        action = f"open src/file{k}.py" if k < 2 else "python -m pytest tests"
        hist.append({"role": "assistant", "content": f"Let me look. {action}",
                     "thought": "Let me look.", "action": action, "agent": "primary"})
        hist.append({"role": "user", "content": f"output {k} " * 30, "agent": "primary"})
        steps.append({"action": action, "observation": "...",
                      "execution_time": (0.25 + k) if timed else None})
    fc = {"role": "assistant", "content": "done", "action": "submit", "agent": "primary",
          "tool_calls": "[{'function': {'arguments': '{}', 'name': 'submit'}, 'id': 'c1'}]"}
    hist.append(fc)
    return {"environment": "x", "trajectory": steps, "history": hist, "info": {}}


@pytest.fixture
def swe_tar(tmp_path):
    f = tmp_path / "trajectories.tar.xz"
    with tarfile.open(f, "w:xz") as tar:
        for name, doc in (("a.traj", _traj("bug one", True)), ("b.traj", _traj("bug two", False))):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return f


def test_swe_agent(tmp_path, swe_tar):
    header, recs = convert("swe-agent", swe_tar, ConvertOptions(window_s=10))
    assert header.block_size == 16 and header.extra["hash_kind"] == "text"
    assert len(_valid(tmp_path, header, recs)) == 8
    a, b = (_by_session(recs)[k] for k in "ab")
    # the shared system prompt gives both trajectories the same leading blocks
    shared = 0
    while a[0].hash_ids[shared] == b[0].hash_ids[shared]:
        shared += 1
    assert shared >= 10 and a[0].hash_ids[shared:] != b[0].hash_ids[shared:]
    # the prompt grows: each call extends the previous one's full blocks
    for x, y in zip(a, a[1:]):
        full = x.input_length // 16
        assert y.hash_ids[:full] == x.hash_ids[:full] and y.input_length > x.input_length
    assert [r.tool_name for r in a] == ["open", "open", "python", "submit"]
    assert a[2].tool_args == {"action": "python -m pytest tests"}
    assert [r.tool_duration_ms for r in a] == [250, 1250, 2250, None]
    assert all(r.tool_duration_ms is None for r in b)
    assert all(r.agent == "primary" for r in recs)
    # a folder of .traj files converts the same
    d = tmp_path / "dir"
    d.mkdir()
    with tarfile.open(swe_tar) as tar:
        tar.extractall(d, filter="data")
    assert [r.hash_ids for r in convert("swe-agent", d, ConvertOptions(window_s=10))[1]] == \
        [r.hash_ids for r in recs]


def test_swe_agent_bad_input(tmp_path):
    f = tmp_path / "x.traj"
    f.write_text(json.dumps({"trajectory": []}))
    with pytest.raises(TraceError, match="'history' list"):
        convert("swe-agent", f)
    g = tmp_path / "notatar.tar.xz"
    g.write_bytes(b"nope")
    with pytest.raises(TraceError, match="cannot read as a tar"):
        convert("swe-agent", g)


# ---------------------------------------------------------------------------------------
# TraceLab

def _round(sid, provider, i, total, prefix, ts, tools=()):
    return {"provider": provider, "session_id": sid, "round_index": i, "model": "m",
            "input_tokens_total": total, "prefix_tokens": prefix, "newly_append_tokens":
            total - prefix, "output_tokens": 50,
            "timing_events": [{"event_type": "user_message", "timestamp": ts}],
            "tools": [{"tool_index": k, "tool_name": n, "tool_wall_latency_ms": lat,
                       "emitted_at": e, "result_at": r} for k, (n, lat, e, r) in
                      enumerate(tools)]}


@pytest.fixture
def tracelab_file(tmp_path):
    rows = [
        _round("c:1", "claude", 0, 1000, 640, "2026-06-01T05:40:20.000Z",
               [("Bash", 800, "2026-06-01T05:40:30.000Z", "2026-06-01T05:40:30.800Z"),
                ("WebSearch", 5000, "2026-06-01T05:40:30.500Z", "2026-06-01T05:40:35.500Z")]),
        _round("c:1", "claude", 1, 1300, 1040, "2026-06-01T05:40:36.000Z"),
        _round("c:1", "claude", 2, 1500, 320, "2026-06-01T05:40:50.000Z"),
        _round("c:2", "claude", 0, 900, 640, "2026-07-01T00:00:00.000Z"),
        _round("x:1", "codex", 0, 500, 0, "2026-03-01T00:00:00.000Z"),
    ]
    d = tmp_path / "example_sessions" / "sanitized"
    d.mkdir(parents=True)
    f = d / "round_trace.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def test_tracelab(tmp_path, tracelab_file):
    header, recs = convert("tracelab", tracelab_file.parent.parent, ConvertOptions(window_s=0))
    assert header.extra["hash_kind"] == "positional"
    assert len(_valid(tmp_path, header, recs)) == 5
    s = _by_session(recs)
    r0, r1, r2 = s["c:1"]
    assert [len(r.hash_ids) for r in (r0, r1, r2)] == [63, 82, 94]
    assert r1.hash_ids[:63] == r0.hash_ids[:63]  # 1040 // 16 = 65 > 63: all of round 0
    assert r1.hash_ids[63] != r0.hash_ids[62]
    assert r2.hash_ids[:20] == r1.hash_ids[:20] and r2.hash_ids[20] != r1.hash_ids[20]
    # the first round's cached prefix is the provider's anchor, shared across its sessions
    other = s["c:2"][0]
    assert other.hash_ids[:40] == r0.hash_ids[:40] and other.hash_ids[40] != r0.hash_ids[40]
    assert not set(s["x:1"][0].hash_ids) & set(r0.hash_ids)
    assert r0.agent == "claude" and s["x:1"][0].agent == "codex"
    assert r0.tool_name == "WebSearch" and r0.tool_args == {"tools": ["Bash", "WebSearch"]}
    assert r0.tool_duration_ms == 5500  # wall span of the parallel tools
    assert (r1.timestamp - r0.timestamp, r2.timestamp - r0.timestamp) == (16_000, 30_000)


def test_tracelab_bad_round(tmp_path):
    f = tmp_path / "round_trace.jsonl"
    bad = _round("c:1", "claude", 0, 100, 0, "2026-06-01T05:40:20.000Z")
    bad["timing_events"] = []
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match="round_trace.jsonl:1: round has no timing_events"):
        convert("tracelab", f)
    bad = _round("c:1", "claude", 0, -5, 0, "2026-06-01T05:40:20.000Z")
    f.write_text(json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=":1: input_tokens_total must be"):
        convert("tracelab", f)


# ---------------------------------------------------------------------------------------
# Azure 2023

def test_azure(tmp_path):
    f = tmp_path / "AzureLLMInferenceTrace_code.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,4808,10\n"
                 "2023-11-16 18:15:46.1805900,33,8\n"
                 "2023-11-16 18:15:50.0000000,16,1\n")
    header, recs = convert("azure", tmp_path)
    assert header.extra["arrivals_only"] and header.block_size == 16
    assert [r.timestamp for r in recs] == [0, 500, 3819.41]
    assert [len(r.hash_ids) for r in recs] == [3, 301, 1]
    ids = [h for r in recs for h in r.hash_ids]
    assert len(ids) == len(set(ids))  # nothing shared
    assert len(_valid(tmp_path, header, recs)) == 3
    assert len(convert("azure", f, ConvertOptions(block_size=512, limit=2))[1]) == 2


@pytest.mark.parametrize("text,problem", [
    ("a,b,c\n", r":1: expected a header"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n", r":2: bad row"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", r":2: bad row"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,1\n", r":2: token counts"),
])
def test_azure_bad_csv(tmp_path, text, problem):
    f = tmp_path / "a.csv"
    f.write_text(text)
    with pytest.raises(TraceError, match=problem):
        convert("azure", f)


def test_unknown_dataset_and_options(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        convert("sharegpt", tmp_path)
    with pytest.raises(ValueError, match="either --window-s or --time-compression"):
        convert("chatdev", tmp_path, ConvertOptions(window_s=1, time_compression=2))
    with pytest.raises(TraceError, match="no such file"):
        convert("weka", tmp_path / "missing")
    assert set(CONVERTERS) == {"mooncake", "weka", "chatdev", "swe-agent", "tracelab", "azure"}


# ---------------------------------------------------------------------------------------
# CLI

def test_cli_convert(tmp_path, weka_dir, capsys):
    out = tmp_path / "w.jsonl.xz"
    assert main(["trace", "convert", "--from", "weka", str(weka_dir), "-o", str(out),
                 "--seed", "2", "--window-s", "100"]) == 0
    header, recs = read_trace(out)
    assert header.extra["converter"] == "weka" and len(recs) == 9
    assert "wrote 9 requests (2 sessions)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,problem", [
    (["--from", "weka", "MISSING", "-o", "OUT"], "missing: no such file or directory"),
    (["--from", "chatdev", "SRC", "-o", "OUT", "--window-s", "-1"], "--window-s must be >= 0"),
    (["--from", "chatdev", "SRC", "-o", "OUT", "--time-compression", "0"],
     "--time-compression must be > 0"),
    (["--from", "azure", "BADCSV", "-o", "OUT"], "expected a header"),
    (["--from", "azure", "GOODCSV", "-o", "/nonexistent/dir/x.jsonl"], "cannot write"),
])
def test_cli_convert_errors(tmp_path, capsys, argv, problem):
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n")
    good = tmp_path / "good.csv"
    good.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n")
    subst = {"SRC": str(tmp_path), "OUT": str(tmp_path / "o.jsonl"), "BADCSV": str(bad),
             "GOODCSV": str(good), "MISSING": str(tmp_path / "missing")}
    argv = [subst.get(a, a) for a in argv]
    assert main(["trace", "convert", *argv]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------
# Real datasets (data/traces, committed): counts from data/traces/SOURCES.md

def test_real_mooncake():
    src = repo_trace("mooncake/conversation_trace.jsonl.xz")
    header, recs = convert("mooncake", src)
    assert len(recs) == 12_031 and header.block_size == 512
    from anchorage.sim.replay import infinite_hit_rate, make_contexts
    assert infinite_hit_rate(make_contexts(recs), 512) == pytest.approx(0.366, abs=0.001)


def test_real_weka_first_sessions():
    """Full conversion takes minutes; the first 40 sessions are checked against a
    request count taken directly from the files."""
    src = repo_trace("weka_claude_code/traces")
    header, recs = convert("weka", src, ConvertOptions(limit=40))
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import session_files
    expected = 0
    subagents = set()
    for f in session_files(str(src))[:40]:
        for r in load_json(f)["requests"]:
            if r["type"] == "subagent":
                expected += len(r["requests"])
                subagents.add(f"subagent:{r['subagent_type']}")
            else:
                expected += 1
    assert len(recs) == expected and len({r.session_id for r in recs}) == 40
    assert {r.agent for r in recs} == {"main"} | subagents
    assert sum(r.tool_duration_ms is not None for r in recs) > len(recs) / 2


def test_real_chatdev():
    src = repo_trace("chatdev/derived/chatdev.jsonl.xz")
    _, recs = convert("chatdev", src)
    assert len(recs) == 1_905 and len({r.session_id for r in recs}) == 94
    roles = {r.agent for r in recs} - {"unmatched"}
    assert len(roles) == 11
    from anchorage.sim.replay import infinite_hit_rate, make_contexts
    assert infinite_hit_rate(make_contexts(recs), 16) == pytest.approx(0.543, abs=0.005)


def test_real_swe_agent():
    src = repo_trace("swe_agent/trajectories.tar.xz")
    _, recs = convert("swe-agent", src)
    assert len({r.session_id for r in recs}) == 22
    assert sum(r.tool_duration_ms is not None for r in recs) == 39  # measured tool times
    assert len(recs) == 230


def test_real_tracelab():
    src = repo_trace("tracelab/example_sessions")
    _, recs = convert("tracelab", src)
    assert len(recs) == 19 and len({r.session_id for r in recs}) == 2


@pytest.mark.parametrize("name,count", [("AzureLLMInferenceTrace_code.csv", 8_819),
                                        ("AzureLLMInferenceTrace_conv.csv", 19_366)])
def test_real_azure(name, count):
    _, recs = convert("azure", repo_trace(f"azure_llm_2023/{name}"))
    assert len(recs) == count
