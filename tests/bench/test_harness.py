"""bench.harness: job fan-out (inline, process pool without Ray), the run cache, tables,
result JSON, the merge rules; bench_policies --merge on top of them. The Ray-task path is
tested in tests/router/test_bench_fanout.py (it needs the router tests' private Ray)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from bench import harness
from bench.harness import Column, Fanout, RunCache, run_jobs
from tests.bench import fanout_jobs
from tests.bench.fanout_jobs import square
from tests.conftest import REPO


def jobs(n: int, sleep=lambda i: 0.0) -> list[dict]:
    return [{"x": i, "sleep_s": sleep(i)} for i in range(n)]


def test_inline_runs_in_this_process_in_order():
    fanout_jobs.CALLS.clear()
    seen = []
    out = run_jobs(square, jobs(4), on_result=lambda j, r: seen.append(j["x"]))
    assert [r["y"] for r in out] == [0, 1, 4, 9]
    assert {r["pid"] for r in out} == {os.getpid()}
    assert seen == [0, 1, 2, 3] and len(fanout_jobs.CALLS) == 4


def test_pool_without_ray_keeps_job_order(monkeypatch, capsys):
    monkeypatch.setattr(harness, "ray_installed", lambda: False)
    seen = []
    # the first job finishes last: results still come back in job order
    out = run_jobs(square, jobs(3, sleep=lambda i: 0.3 if i == 0 else 0.0), Fanout(2),
                   on_result=lambda j, r: seen.append(j["x"]))
    assert [r["y"] for r in out] == [0, 1, 4]
    assert os.getpid() not in {r["pid"] for r in out}
    assert seen[-1] == 0 and sorted(seen) == [0, 1, 2]
    assert "Ray is not installed" in capsys.readouterr().err


def test_ray_address_without_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(harness, "ray_installed", lambda: False)
    with pytest.raises(SystemExit, match="--ray-address needs Ray"):
        run_jobs(square, jobs(1), Fanout(1, "auto"))


def test_fanout_rejects_zero_jobs():
    with pytest.raises(ValueError, match="--jobs"):
        Fanout(0)


def test_cache_resumes_and_runs_only_missing_jobs(tmp_path):
    path = tmp_path / "runs.jsonl"
    fanout_jobs.CALLS.clear()
    cache = RunCache(path)
    run_jobs(lambda j: square({"x": j[0]}), [(1, "a"), (2, "b")], cache=cache)
    assert len(fanout_jobs.CALLS) == 2 and len(path.read_text().splitlines()) == 2
    again = RunCache(path)                          # a new process reads the file back
    assert len(again) == 2 and (1, "a") in again and [1, "a"] in again
    fanout_jobs.CALLS.clear()
    out = run_jobs(lambda j: square({"x": j[0]}), [(2, "b"), (3, "c"), (1, "a")], cache=again)
    assert [r["y"] for r in out] == [4, 9, 1]
    assert [c["x"] for c in fanout_jobs.CALLS] == [3]  # only the missing job ran
    assert len(path.read_text().splitlines()) == 3


def test_cache_names_a_bad_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({"job": [1], "row": {}}) + "\n{broken\n")
    with pytest.raises(SystemExit, match=r"runs.jsonl:2"):
        RunCache(path)


def test_cache_without_a_file_remembers_this_process_only():
    c = RunCache(None)
    c.put({"a": 1}, {"r": 2})
    assert {"a": 1} in c and c[{"a": 1}] == {"r": 2} and c.path is None


def test_table_terminal_and_markdown():
    rows = [{"name": "lru", "hit": 0.1234, "n": 7}, {"name": "hybrid", "hit": None, "n": 12}]
    cols = [Column("policy", "name", align="<"), Column("hit", "hit", ".1%"),
            Column("n x2", lambda r: 2 * r["n"], width=6)]
    text = harness.table(cols, rows)
    assert text.splitlines() == ["policy    hit    n x2", "lru     12.3%      14",
                                 "hybrid      -      24"]
    assert harness.table(cols, rows, markdown=True).splitlines() == [
        "| policy | hit | n x2 |", "|---|---|---|", "| lru | 12.3% | 14 |",
        "| hybrid | - | 24 |"]
    assert harness.table(cols, rows, rule=True).splitlines()[1] == "-" * len(text.splitlines()[0])


def test_write_json_adds_meta_and_cleans(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_GEN_SESSIONS", "40")
    path = harness.write_json(tmp_path / "sub" / "r.json",
                              {"v": float("nan"), "by": {(1, 2): math.inf}, "xs": (1, 2)})
    doc = json.loads(path.read_text())
    assert doc["v"] is None and doc["by"] == {"(1, 2)": None} and doc["xs"] == [1, 2]
    m = doc["meta"]
    assert m["env"]["BENCH_GEN_SESSIONS"] == "40"
    assert len(m["commit"]) == 40 and "cores" in m["machine"]
    assert m["command"].startswith("python")
    plain = json.loads(harness.write_json(tmp_path / "p.json", {"a": 1}, with_meta=False)
                       .read_text())
    assert plain == {"a": 1}


def test_merge_rules():
    a = [{"k": 1, "v": "a1"}, {"k": 2, "v": "a2"}]
    b = [{"k": 2, "v": "b2"}, {"k": 3, "v": "b3"}]
    assert harness.merge_latest(a + b, key=lambda r: r["k"]) == [
        {"k": 1, "v": "a1"}, {"k": 2, "v": "b2"}, {"k": 3, "v": "b3"}]
    assert harness.replace_rows(a, b[:1], key=lambda r: r["k"]) == [
        {"k": 1, "v": "a1"}, {"k": 2, "v": "b2"}]


def _policies_doc(workload: str, hybrid: float, hot: float) -> dict:
    row = {"workload": workload, "capacity": "half-lru", "blocks": 10, "lru": 0.30,
           "arc": 0.31, "hybrid": hybrid, "belady": 0.50}
    return {"workloads": [{"workload": workload, "rows": [row]}],
            "hot_path_us": {"lru": 0.1, "hybrid": hot}, "state_bytes_24_agents": {"x": 1}}


def test_policies_merge_later_file_wins_and_targets_are_rechecked(tmp_path):
    from bench import bench_policies

    files = []
    for i, doc in enumerate([_policies_doc("gen-pipeline-1", 0.35, 1.0),
                             _policies_doc("chatdev-0", 0.32, 2.0),
                             _policies_doc("gen-pipeline-1", 0.48, 3.0)]):
        files.append(tmp_path / f"{i}.json")
        files[-1].write_text(json.dumps(doc))
    out = tmp_path / "merged.json"
    assert bench_policies.merge([str(f) for f in files], str(out)) == 0
    doc = json.loads(out.read_text())
    assert [w["workload"] for w in doc["workloads"]] == ["gen-pipeline-1", "chatdev-0"]
    assert doc["workloads"][0]["rows"][0]["hybrid"] == 0.48
    assert doc["workloads"][0]["rows"][0]["gap_closed"] == pytest.approx(0.9)
    assert doc["hot_path_us"]["hybrid"] == 3.0 and doc["merged_from"] == [str(f) for f in files]
    assert doc["target_misses"] == [
        "MISS chatdev-0 half-lru: hybrid closes 10% of the lru-belady gap (target 80%)"]


def test_scripts_run_as_modules_without_path_tricks():
    """Every script is a module of the ``bench`` package: ``--help`` works from the root
    and no script edits sys.path."""
    scripts = sorted(p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__")
    for name in scripts:
        assert "sys.path" not in (REPO / "bench" / f"{name}.py").read_text(), name
    for name in ("bench_policies", "bench_router_sim", "bench_tiering"):
        p = subprocess.run([sys.executable, "-m", f"bench.{name}", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120, check=False)
        assert p.returncode == 0 and "--jobs" in p.stdout, p.stderr
