"""bench.harness fans a sweep out as Ray tasks: on the router tests' private Ray (inside
their network namespace), two tiny jobs run in Ray workers, come back in job order, and
the harness leaves a Ray it did not start running."""

from __future__ import annotations


def test_jobs_run_as_ray_tasks(cluster):
    got = cluster["ns"]("bench_fanout", 2)
    assert [r["y"] for r in got["results"]] == [0, 1]
    assert all(r["pid"] != got["driver_pid"] for r in got["results"])
    assert got["ray_still_up"]
