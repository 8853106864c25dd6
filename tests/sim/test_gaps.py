"""anchorage.sim.gaps: tool-gap quantiles, rank-based mapping onto the WEKA distribution,
and bench.bench_timed --tool-gaps."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys

import pytest

from anchorage.sim.gaps import (
    TOOL_GAPS,
    WEKA_CUTOFF_MS,
    WEKA_TOOL_GAP_MS,
    closed_loop_gaps_s,
    match_tool_gaps,
    tool_gap_quantiles,
)
from anchorage.trace.format import TraceRecord
from tests.conftest import REPO, repo_trace


def recs(durations):
    out = []
    for i, d in enumerate(durations):
        out.append(TraceRecord(timestamp=float(i), hash_ids=[i], output_length=5, input_length=16,
                               session_id=f"s{i % 3}", tool_name=None if d is None else "grep",
                               tool_args=None if d is None else {"path": str(i)},
                               tool_duration_ms=d))
    return out


def test_mapping_keeps_order_and_other_fields():
    rng = random.Random(1)
    durs = [None if rng.random() < 0.3 else round(rng.lognormvariate(4, 2), 1)
            for _ in range(400)]
    before = recs(durs)
    after = match_tool_gaps(before, WEKA_TOOL_GAP_MS)
    assert [r.tool_duration_ms for r in before] == durs  # input untouched
    for a, b in zip(before, after):
        assert (a.tool_duration_ms is None) == (b.tool_duration_ms is None)
        assert (a.hash_ids, a.session_id, a.tool_name, a.tool_args, a.timestamp) == \
            (b.hash_ids, b.session_id, b.tool_name, b.tool_args, b.timestamp)
    pairs = [(a.tool_duration_ms, b.tool_duration_ms) for a, b in zip(before, after)
             if a.tool_duration_ms is not None]
    src = sorted(pairs)
    assert [m for _, m in src] == sorted(m for _, m in src)  # monotone: order kept


def test_mapping_gives_the_target_distribution():
    durs = [float(i % 97) * 3.0 + 1.0 for i in range(2000)]  # any source distribution
    after = match_tool_gaps(recs(durs), WEKA_TOOL_GAP_MS)
    got = tool_gap_quantiles(after)
    for p in (10, 25, 50, 75, 90):
        assert got[p] == pytest.approx(WEKA_TOOL_GAP_MS[p], rel=0.05, abs=100), p
    assert min(r.tool_duration_ms for r in after) >= WEKA_TOOL_GAP_MS[0]
    assert max(r.tool_duration_ms for r in after) <= WEKA_TOOL_GAP_MS[-1]


def test_quantiles_and_bad_input():
    q = tool_gap_quantiles(recs([4.0, None, 1.0, 3.0, 2.0, 1e9]), points=4, cutoff_ms=10)
    assert q == pytest.approx([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="no tool gaps"):
        tool_gap_quantiles(recs([None, None]))
    with pytest.raises(ValueError, match="points"):
        tool_gap_quantiles(recs([1.0]), points=1)
    with pytest.raises(ValueError, match="non-decreasing"):
        match_tool_gaps(recs([1.0]), [0, 5, 3])
    with pytest.raises(ValueError, match="at least 2"):
        match_tool_gaps(recs([1.0]), [5])
    assert match_tool_gaps(recs([None]), [0, 1])[0].tool_duration_ms is None
    assert set(TOOL_GAPS) == {"generator", "weka"} and TOOL_GAPS["generator"] is None


def test_weka_table_matches_the_real_traces():
    """A fixed sample (every 8th session, through the WEKA converter) has the table's
    shape; the full table is reproduced by the command in anchorage.sim.gaps (~1 min)."""
    src = repo_trace("weka_claude_code/traces")
    from anchorage.trace.convert.common import load_json
    from anchorage.trace.convert.weka import convert_session, session_files
    next_id = [0]
    records = [r for f in session_files(str(src))[::8]
               for r in convert_session(f, load_json(f), next_id)]
    got = tool_gap_quantiles(records, cutoff_ms=WEKA_CUTOFF_MS)
    for p in (25, 50, 75, 90):
        assert got[p] == pytest.approx(WEKA_TOOL_GAP_MS[p], rel=0.3), p
    assert got[50] >= 5000  # seconds, where the generator's median is under one


def _bench_timed():
    from bench import bench_timed

    return bench_timed


def test_bench_workload_with_weka_gaps():
    bt = _bench_timed()
    gen, _ = bt.workload("selector", 30, 1, 64.0)
    weka, ctxs = bt.workload("selector", 30, 1, 64.0, tool_gaps="weka")
    assert len(ctxs) == len(weka) == len(gen)
    assert [r.tool_name for r in gen] == [r.tool_name for r in weka]
    g = [r.tool_duration_ms for r in gen if r.tool_duration_ms is not None]
    w = [r.tool_duration_ms for r in weka if r.tool_duration_ms is not None]
    order = sorted(range(len(g)), key=lambda i: (g[i], i))
    assert all(w[a] <= w[b] for a, b in itertools.pairwise(order))  # same order of gaps
    assert sorted(w)[len(w) // 2] > 10 * sorted(g)[len(g) // 2]  # seconds, not ms


def test_bench_rejects_unknown_tool_gaps():
    p = subprocess.run([sys.executable, "-m", "bench.bench_timed", "--tool-gaps",
                        "nope", "--policies", "lru"], capture_output=True, text=True, check=False,
                       timeout=120, cwd=REPO)
    assert p.returncode == 2
    assert "--tool-gaps" in p.stderr and "Traceback" not in p.stderr


def test_closed_loop_gaps_follow_the_workload():
    rs = recs([1500.0, None, 250.0, None, 40.0, 7.0])  # sessions s0: 0,3  s1: 1,4  s2: 2,5
    rs.append(TraceRecord(timestamp=9.0, hash_ids=[9], output_length=1, input_length=16))
    gaps = closed_loop_gaps_s(rs, think_s=0.5)
    assert gaps == [1.5, 0.5, 0.25, math.inf, math.inf, math.inf, math.inf]


def test_cachewise_oracle_waits_on_the_simulator_clock():
    from types import SimpleNamespace

    from anchorage.policies.registry import make_policy
    from anchorage.sim.replay import make_contexts
    rs = recs([1500.0, None, 250.0, None, 40.0, 7.0])
    ctxs = make_contexts(rs)
    gaps = closed_loop_gaps_s(rs)
    p = make_policy("cachewise-oracle", contexts=ctxs, next_gap_s=gaps)
    sess = SimpleNamespace(last_seq=0, last_s=100.0, ended=False, n=1)
    assert p.view.session_wait(sess, 100.5) == pytest.approx(1.0)  # done at 100 s + 1.5 s
    assert p.view.session_wait(sess, 200.0) == 0.0
    sess.last_seq = 3  # the session's last request: never back
    assert p.view.session_wait(sess, 100.0) == math.inf
    trace_clock = make_policy("cachewise-oracle", contexts=ctxs)  # sequential replay
    sess.last_seq = 0
    assert trace_clock.view.session_wait(sess, 0.0) == pytest.approx(ctxs[3].now_s)
    with pytest.raises(ValueError, match="next_gap_s"):
        make_policy("cachewise-oracle", contexts=ctxs, next_gap_s=gaps[:-1])


def _doc(seed, capacity=8192):
    runs = []
    for p, k in (("lru", 1.0), ("hybrid", 1.1)):
        for n in (4, 8):
            r = {"policy": p, "scale": n, "slots": n, "seed": seed,
                 "throughput_rps": k * n * seed, "ttft_mean_s": 1.0 / k, "ttft_p90_s": 2.0,
                 "ttft_p99_s": 3.0, "hit_rate": 0.5 * k, "latency_mean_s": 1.0,
                 "session_time_mean_s": 9.0, "queue_mean_s": 0.1, "preemptions": 0}
            runs.append(r)
    return {"bench": "timed", "profile": "h200-llama3-8b", "replicas": 4,
            "capacity_blocks": capacity, "router": "session", "topology": "selector",
            "sessions_per_slot": 2, "min_sessions": 100, "seeds": [seed], "output_scale": 0.25,
            "admission": "fcfs", "tool_gaps": "weka", "concurrency": 64.0, "slots": [4, 8],
            "machine": "m", "wall_s": 1.0, "cpu_s": 2.0, "policies": {"lru": {}, "hybrid": {}},
            "per_seed": {}, "saturation_slots": 8, "runs": runs}


def test_bench_merge_combines_seed_files(tmp_path, capsys):
    import json
    bt = _bench_timed()
    paths = []
    for seed in (1, 2):
        p = tmp_path / f"s{seed}.json"
        p.write_text(json.dumps(_doc(seed)))
        paths.append(str(p))
    out = tmp_path / "all.json"
    assert bt.merge(paths, str(out)) == 0
    doc = json.loads(out.read_text())
    assert doc["seeds"] == [1, 2] and len(doc["runs"]) == 8 and doc["cpu_s"] == 4.0
    hy = doc["policies"]["hybrid"]
    assert hy["peak_gain_vs_lru"] == pytest.approx(0.1)
    assert hy["ttft_reduction_vs_lru"] == pytest.approx(1 - 1 / 1.1)
    assert hy["spread"]["peak_vs_lru_per_seed"] == pytest.approx([0.1, 0.1])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_doc(3, capacity=4096)))
    assert bt.merge([paths[0], str(bad)], str(tmp_path / "x.json")) == 2
    assert "capacity_blocks" in capsys.readouterr().err
    assert bt.merge([paths[0], paths[0]], str(tmp_path / "x.json")) == 2
    assert bt.merge([str(tmp_path / "missing.json")], str(tmp_path / "x.json")) == 2
