"""anchorage.bench (the policy sweep behind `anchorage bench` and bench/bench_policies.py)
and anchorage.workloads' specs: capacities, the half-LRU search, tables, the CLI's --json."""

from __future__ import annotations

import json

import pytest

from anchorage import bench, workloads
from anchorage.cli import main


@pytest.fixture(scope="module")
def wl():
    return workloads.load("generated:pipeline:1", sessions=6, concurrency=8.0)


def test_half_lru_search_settings(wl):
    target = wl.infinite_hit_rate / 2
    cli = bench.half_lru_capacity(wl)
    committed = bench.half_lru_capacity(wl, bench.HalfLRUSearch(
        lo_frac=0.0, iters=14, stop_lo_div=None, stop_unique_div=400))
    for cap in (cli, committed):
        assert 1 <= cap <= wl.unique_blocks
        assert bench.run_one(wl, cap, "lru")["hit_rate"] >= target
    assert bench.run_one(wl, max(1, committed - wl.unique_blocks // 400 - 1), "lru")["hit_rate"] < target


def test_sweep_rows_and_table(wl):
    caps = bench.fraction_capacities(wl, [0.05, 0.1])
    assert [c[0] for c in caps] == ["5%", "10%"]
    assert caps[1][1] == round(wl.unique_blocks * 0.1)
    rows = bench.sweep(wl, caps, ["lru", "hybrid", "belady"])
    assert [r.capacity_blocks for r in rows] == [c[1] for c in caps]
    for r in rows:
        assert r.results["lru"]["hit_rate"] <= r.results["belady"]["hit_rate"] + 1e-12
        assert r.results["hybrid"]["policy"] == "hybrid"
        assert r.results["hybrid"]["state_bytes"] > 0
    md = bench.format_rows(rows, ["lru", "hybrid", "belady"], markdown=True).splitlines()
    assert md[0] == "| workload | capacity | blocks | infinite | lru | hybrid | belady | hybrid gap closed |"
    assert md[2].startswith(f"| generated:pipeline:1 | 5% | {caps[0][1]} |")
    text = bench.format_rows(rows, ["lru"]).splitlines()
    assert text[0].startswith("workload" + " " * 18 + "   capacity")


def test_workload_specs_name_what_is_wrong(tmp_path):
    with pytest.raises(workloads.WorkloadUnavailable, match="bad seed"):
        workloads.load("chatdev:x", tmp_path)
    with pytest.raises(workloads.WorkloadUnavailable, match="unknown workload 'mooncake:1'"):
        workloads.load("mooncake:1", tmp_path)
    with pytest.raises(workloads.WorkloadUnavailable, match="not found"):
        workloads.load("weka:2", tmp_path)
    with pytest.raises(workloads.WorkloadUnavailable, match="cannot generate"):
        workloads.load("generated:nope", tmp_path)


def test_cli_json_contract(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--workloads", "generated:selector:2", "--sessions", "5",
                 "--policies", "lru,belady", "--capacities", "0.1", "--no-half-lru",
                 "--json", str(out), "--markdown", str(tmp_path / "t.md")]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"machine", "policies", "rows"} and doc["policies"] == ["lru", "belady"]
    (row,) = doc["rows"]
    assert row["workload"] == "generated:selector:2" and row["capacity"] == "10%"
    assert {"hit_rate", "evictions", "us_per_request", "policy"} <= set(row["results"]["lru"])
    assert (tmp_path / "t.md").read_text().startswith("| workload | capacity |")
    assert main(["bench", "--workloads", "generated:selector", "--policies", "nope"]) == 2
    assert "unknown policy nope" in capsys.readouterr().err
