"""The committed traces (data/traces, issue 43): complete, unchanged, found from anywhere.

- every file is the one ``SHA256SUMS`` names (nothing missing, nothing unlisted), and
  ``SOURCES.json`` agrees with the folders and with ``SOURCES.md``;
- each folder keeps its upstream licence text;
- the default traces directory is the repository's, whatever the working directory,
  ``$ANCHORAGE_TRACES`` / ``--traces-dir`` override it, and a missing trace names both;
- every real workload the code loads by default resolves inside the repository;
- no committed trace is ignored by git (a fresh clone has them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from anchorage import workloads
from tests.conftest import REPO, TRACES, need

META = {"SHA256SUMS", "SOURCES.json", "SOURCES.md"}


def _data_files() -> list[str]:
    return sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*")
                  if p.is_file() and p.name not in META)


def test_every_file_matches_sha256sums():
    listed = {}
    for line in (TRACES / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split("  ", 1)
        listed[rel] = digest
    assert sorted(listed) == _data_files()
    bad = [rel for rel, d in listed.items()
           if hashlib.sha256((TRACES / rel).read_bytes()).hexdigest() != d]
    assert not bad, f"changed since SHA256SUMS was written: {bad[:5]}"


def test_sources_describe_every_folder():
    doc = json.loads((TRACES / "SOURCES.json").read_text())
    folders = sorted(p.name for p in TRACES.iterdir() if p.is_dir())
    assert sorted(s["local"].rstrip("/") for s in doc["datasets"]) == folders
    md = (TRACES / "SOURCES.md").read_text()
    for s in doc["datasets"]:
        d = TRACES / s["local"]
        files = [p for p in d.rglob("*") if p.is_file()]
        assert (len(files), sum(p.stat().st_size for p in files)) == (s["files_here"],
                                                                       s["bytes_here"]), s["name"]
        assert len(s["commit"]) >= 40 and s["repo"] in md and s["license"] and s["redistribution"]
        assert any(p.name.startswith(("LICENSE", "LICENCE")) for p in d.iterdir()), s["name"]
        assert f"`{s['local']}`" in md, s["name"]
        assert f"{s['files_here']}, {s['bytes_here']:,}" in md, s["name"]


def test_default_traces_dir_is_the_repositorys_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("ANCHORAGE_TRACES", raising=False)
    monkeypatch.chdir(tmp_path)
    assert workloads.default_traces_dir() == REPO / "data" / "traces"
    monkeypatch.setenv("ANCHORAGE_TRACES", str(tmp_path / "elsewhere"))
    assert workloads.default_traces_dir() == tmp_path / "elsewhere"


@pytest.mark.parametrize("spec", workloads.REAL)
def test_each_real_workload_loads_from_the_repository(spec, monkeypatch):
    monkeypatch.delenv("ANCHORAGE_TRACES", raising=False)
    wl = workloads.load(spec, limit=3)
    assert Path(wl.source).resolve().is_relative_to(REPO / "data" / "traces"), wl.source
    assert wl.contexts and wl.unique_blocks > 0


def test_the_fleet_and_tiering_benchmarks_read_the_repository(monkeypatch):
    monkeypatch.delenv("ANCHORAGE_TRACES", raising=False)
    from bench import fleet_workloads

    fleet_workloads._CACHE.clear()
    for rel in ("weka_claude_code", "swe_agent/trajectories.tar.xz",
                "mooncake/conversation_trace.jsonl.xz"):
        assert workloads.trace_path(rel) == REPO / "data" / "traces" / rel
    recs, _, bs = fleet_workloads.load("weka", 2, 1)
    assert bs == 256 and len({r.session_id for r in recs}) == 2


def test_a_missing_trace_names_the_override(tmp_path, monkeypatch):
    monkeypatch.setenv("ANCHORAGE_TRACES", str(tmp_path))
    with pytest.raises(workloads.WorkloadUnavailable) as exc:
        workloads.load("mooncake")
    assert str(tmp_path / "mooncake") in str(exc.value)
    assert "$ANCHORAGE_TRACES" in str(exc.value) and "--traces-dir" in str(exc.value)
    # a folder with the same layout elsewhere is read instead of the repository's
    (tmp_path / "mooncake").mkdir()
    shutil.copy(TRACES / "mooncake" / "synthetic_trace.jsonl.xz", tmp_path / "mooncake")
    wl = workloads.load("mooncake-synthetic")
    assert wl.source == str(tmp_path / "mooncake" / "synthetic_trace.jsonl.xz")
    # an installed (non-editable) package has no data/traces beside it: the same message
    monkeypatch.delenv("ANCHORAGE_TRACES")
    monkeypatch.setattr(workloads, "REPO_TRACES", tmp_path / "site-packages" / "data" / "traces")
    with pytest.raises(workloads.WorkloadUnavailable,
                       match=r"\$ANCHORAGE_TRACES or pass --traces-dir"):
        workloads.trace_path("weka_claude_code")


def test_bench_cli_traces_dir_overrides_and_reports(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ANCHORAGE_TRACES"}
    argv = [sys.executable, "-m", "anchorage.cli", "bench", "--workloads", "mooncake",
            "--policies", "lru", "--capacities", "0.05", "--no-half-lru"]
    bad = subprocess.run(argv + ["--traces-dir", str(tmp_path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "skipping workload mooncake" in bad.stderr, bad.stderr
    assert "--traces-dir" in bad.stderr and "Traceback" not in bad.stderr
    ok = subprocess.run(argv + ["--json"], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    rows = json.loads(ok.stdout)["rows"]
    assert {r["workload"] for r in rows} == {"mooncake"}


def test_no_committed_trace_is_ignored_by_git():
    need(shutil.which("git") is not None and (REPO / ".git").exists(), "a git checkout",
         "run from a clone of the repository")
    files = [str(Path("data/traces") / f) for f in _data_files()] + \
            [f"data/traces/{m}" for m in sorted(META)]
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO,
                          input="\n".join(files), capture_output=True, text=True)
    assert proc.returncode == 1 and not proc.stdout, f"ignored by git: {proc.stdout[:500]}"
