"""The fleet benchmark's job matrix: the quick mode is a steady-state closed loop too."""

from __future__ import annotations

import pytest

from bench import bench_fleet


def test_every_quick_job_simulates_more_sessions_than_slots():
    """With one session per slot every session starts at once and the measurement window
    (ramp-up to the last session's start) is empty: the quick mode once reported goodput 0
    on the generated topologies for every stack."""
    args = bench_fleet.parse(["--quick", "--out", "/tmp/anchorage-test-fleet.json"])
    jobs = bench_fleet.make_jobs(args)
    assert {j["workload"] for j in jobs} == {"weka", "swe", "gen", "mooncake"}
    for j in jobs:
        if j["workload"] == "mooncake":
            continue  # open loop
        slots = int(round(j["load"] * j["gpus"]))
        assert bench_fleet.sessions_for(j) > slots, j


def test_one_session_per_slot_is_refused():
    job = {"workload": "gen", "load": 100, "gpus": 4, "min_sessions": 0,
           "sessions_per_slot": 1.0}
    with pytest.raises(ValueError, match="more sessions than slots"):
        bench_fleet.sessions_for(job)
    with pytest.raises(SystemExit):
        bench_fleet.parse(["--quick", "--sessions-per-slot", "1"])
