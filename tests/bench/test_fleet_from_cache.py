"""BENCHMARKS.md's headline table comes out of the committed run cache, and the cache's
runs come out of the simulator on the committed traces (issue 43).

- The ``--from-cache`` command printed in BENCHMARKS.md is read from it and run as written
  (on a copy of the cache, so nothing can be appended to the committed one): the headline
  table it writes must be BENCHMARKS.md's, row for row, and its tables
  ``bench/results/fleet.md``, byte for byte.
- One point of the matrix is simulated again, with the traces under ``data/traces``
  (``$ANCHORAGE_TRACES`` unset): the cheapest ``anchorage`` run of the cache (least CPU),
  which must reproduce the cached row (everything but its CPU and wall time).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from bench import bench_fleet, harness
from tests.conftest import REPO

CACHE = "bench/results/fleet_runs.jsonl"
TIMING = {"cpu_s", "wall_s"}  # how long the run took here, not what it measured


def _section(md: str, heading: str) -> str:
    start = md.index(heading)
    nxt = md.find("\n## ", start + len(heading))
    return md[start: nxt if nxt >= 0 else len(md)]


def _first_table(text: str) -> list[str]:
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("|"))
    rows = []
    for ln in lines[i:]:
        if not ln.startswith("|"):
            break
        rows.append(ln.strip())
    return rows


def benchmarks_command() -> list[str]:
    """The ``bench_fleet --from-cache`` command of BENCHMARKS.md's headline section."""
    sec = _section((REPO / "BENCHMARKS.md").read_text(), "## Headline")
    for block in re.findall(r"```sh\n(.*?)```", sec, re.S):
        argv = shlex.split(block.replace("\\\n", " "), comments=True)
        if "bench.bench_fleet" in argv and "--from-cache" in argv:
            return argv
    raise AssertionError("no bench.bench_fleet --from-cache command in BENCHMARKS.md's headline")


def test_headline_table_rebuilds_from_the_committed_cache(tmp_path):
    argv = benchmarks_command()
    assert argv[:3] == [".venv/bin/python", "-m", "bench.bench_fleet"], argv
    assert argv[argv.index("--cache") + 1] == CACHE, argv
    cache = tmp_path / "fleet_runs.jsonl"
    shutil.copy(REPO / CACHE, cache)
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("--cache") + 1] = str(cache)
    argv += ["--out", str(tmp_path / "fleet.json"), "--plot", ""]  # the plot is not checked
    env = {k: v for k, v in os.environ.items() if k != "ANCHORAGE_TRACES"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "runs cached" in proc.stderr and cache.read_bytes() == (REPO / CACHE).read_bytes()
    md = (tmp_path / "fleet.md").read_text()
    got = _first_table(_section(md, "## Headline"))
    want = _first_table(_section((REPO / "BENCHMARKS.md").read_text(), "## Headline"))
    assert len(want) == 2 + len(bench_fleet.fleet_workloads.WORKLOADS), want
    assert got == want
    assert md == (REPO / "bench/results/fleet.md").read_text()


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (a is None) == (b is None) and (
            a is None or (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _cached_runs() -> list[tuple[dict, dict]]:
    """(job, row) per job of the committed cache, the last line of a job winning (as
    ``harness.RunCache`` reads it)."""
    runs = {}
    for line in (REPO / CACHE).read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            runs[harness.RunCache.key(d["job"])] = (d["job"], d["row"])
    return list(runs.values())


def test_cheapest_anchorage_point_resimulates_to_the_cached_row(monkeypatch):
    monkeypatch.delenv("ANCHORAGE_TRACES", raising=False)
    runs = [(job, row) for job, row in _cached_runs()
            if row.get("stack") == "anchorage" and "error" not in row]
    job, row = min(runs, key=lambda jr: jr[1]["cpu_s"])
    bench_fleet.fleet_workloads._CACHE.clear()
    new = bench_fleet.one_run(job)
    assert "error" not in new, new.get("trace")
    diff = {k: (row.get(k), new.get(k)) for k in (set(row) | set(new)) - TIMING
            if not _same(row.get(k), new.get(k))}
    assert not diff, (job, diff)
