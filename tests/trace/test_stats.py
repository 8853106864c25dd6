"""`anchorage trace stats`: counts, infinite-cache hit rate, reuse distances."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from anchorage.cli import main
from anchorage.sim.replay import infinite_hit_rate, make_contexts
from anchorage.trace.format import TraceHeader, TraceRecord, write_trace
from anchorage.trace.generate import generate
from anchorage.trace.stats import reuse_distances, trace_stats


def _brute_distances(seq):
    stack, out = [], []
    for k in seq:
        if k in stack:
            i = stack.index(k)
            out.append(len(stack) - 1 - i)
            stack.pop(i)
        stack.append(k)
    return out


def _pct(values, q):
    return float(np.percentile(values, q * 100))


def test_reuse_distance_small_example():
    r = reuse_distances([(0.0, ["a", "b", "c"]), (1.0, ["a", "b"]), (3.0, ["b"])], total=6)
    # a after (b, c): 2; b after (c, a): 2; b again: 0
    assert r["reuse_distance_blocks"] == {"p50": 2, "p90": 2, "p99": 2}
    assert r["cold_fraction"] == 0.5 and r["sample_rate"] == 1.0
    # times 1, 1, 2: p99 lies 0.98 of the way from the 2nd to the 3rd
    assert r["reuse_time_s"]["p50"] == 1.0 and r["reuse_time_s"]["p99"] == pytest.approx(1.98)


def test_reuse_distance_matches_brute_force():
    rng = random.Random(4)
    seq = [rng.randrange(300) if rng.random() < 0.8 else rng.randrange(10_000)
           for _ in range(4000)]
    exact = _brute_distances(seq)
    r = reuse_distances(((float(i), [k]) for i, k in enumerate(seq)), total=len(seq))
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        assert r["reuse_distance_blocks"][name] == pytest.approx(_pct(exact, q), rel=1e-12)
    assert r["cold_fraction"] == pytest.approx(1 - len(exact) / len(seq))


def test_reuse_distance_sampling_is_close():
    rng = random.Random(9)
    seq = [int(rng.paretovariate(0.6)) % 20_000 for _ in range(60_000)]
    exact = reuse_distances(((0.0, [k]) for k in seq), total=len(seq))
    approx = reuse_distances(((0.0, [k]) for k in seq), total=len(seq), sample=15_000)
    assert approx["sample_rate"] == pytest.approx(0.25)
    assert approx["sampled_accesses"] < 30_000
    for name in ("p50", "p90"):
        e, a = exact["reuse_distance_blocks"][name], approx["reuse_distance_blocks"][name]
        assert abs(a - e) <= 0.2 * e + 20


def _small_trace(tmp_path):
    recs = [
        TraceRecord(timestamp=0, hash_ids=[1, 2, 3], output_length=5, input_length=48,
                    session_id="s1", agent="a", tool_name="grep", tool_duration_ms=10),
        TraceRecord(timestamp=1000, hash_ids=[1, 2, 4], output_length=5, input_length=48,
                    session_id="s1", agent="b"),
        TraceRecord(timestamp=2000, hash_ids=[1, 2], output_length=5, input_length=32,
                    session_id="s2", agent="a", tenant="t1"),
    ]
    path = tmp_path / "small.jsonl"
    write_trace(path, recs, TraceHeader(block_size=16, source="unit"))
    return path, recs


def test_trace_stats_counts(tmp_path):
    path, recs = _small_trace(tmp_path)
    s = trace_stats(str(path))
    assert (s["requests"], s["sessions"], s["agents"], s["tenants"]) == (3, 2, 2, 1)
    assert s["block_accesses"] == 8
    assert s["unique_blocks"] == 6  # tenant t1's blocks are salted apart
    assert s["infinite_hit_rate"] == pytest.approx(infinite_hit_rate(make_contexts(recs), 16))
    assert s["infinite_hit_rate"] == pytest.approx(2 / 8)
    assert s["tool_calls"] == 1 and s["tool_durations"] == 1 and s["duration_s"] == 2.0
    assert s["reuse_distance_blocks"]["p50"] == 2 and s["cold_fraction"] == 6 / 8


def test_trace_stats_on_generated_workload(tmp_path):
    header, recs = generate("selector", 5, 30, seed=1, mean_requests=8)
    path = tmp_path / "g.jsonl.gz"
    write_trace(path, recs, header)
    s = trace_stats(str(path))
    assert s["requests"] == len(recs) and s["sessions"] == 30 and s["agents"] == 5
    assert 0.5 < s["infinite_hit_rate"] < 1
    rd = s["reuse_distance_blocks"]
    assert 0 <= rd["p50"] <= rd["p90"] <= rd["p99"] < s["unique_blocks"]


def test_cli_stats_text_and_json(tmp_path, capsys):
    path, _ = _small_trace(tmp_path)
    assert main(["trace", "stats", str(path)]) == 0
    text = capsys.readouterr().out
    assert "requests" in text and "infinite-cache hit rate              25.00%" in text
    assert main(["trace", "stats", str(path), "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["requests"] == 3 and obj["unique_blocks"] == 6 and obj["block_size"] == 16


def test_cli_stats_lenient(tmp_path, capsys):
    path, _ = _small_trace(tmp_path)
    with open(path, "a") as fh:
        fh.write('{"timestamp": 5}\n')
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5: missing required field 'hash_ids'" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["trace", "stats", str(path), "--json", "--lenient"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["requests"] == 3 and obj["skipped_lines"] == 1


@pytest.mark.parametrize("argv,problem", [
    (["MISSING"], "no such file"),
    (["GARBAGE"], "cannot read"),
    (["SMALL", "--sample", "0"], "--sample must be positive"),
    (["SMALL", "--block-size", "0"], "--block-size must be positive"),
])
def test_cli_stats_errors(tmp_path, capsys, argv, problem):
    small, _ = _small_trace(tmp_path)
    garbage = tmp_path / "g.jsonl.xz"
    garbage.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 50)
    subst = {"MISSING": str(tmp_path / "nope.jsonl"), "GARBAGE": str(garbage),
             "SMALL": str(small)}
    assert main(["trace", "stats", *[subst.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_trace_without_subcommand(capsys):
    assert main(["trace"]) == 2
    assert "generate" in capsys.readouterr().err
