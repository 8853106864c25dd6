"""`make demo` sets up only what the demo needs (scripts/setup.sh, profile `demo`): the core,
vLLM's CPU build and Ray (the `cpu` and `router` extras) and Prometheus; not the `dev` extra
nor the Kubernetes build `make test` needs. Checked with `make -n` and by running the real
setup script against a stand-in virtualenv whose pip and python record what they are asked
to do (nothing is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO, need

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
exit 0
"""


def test_make_demo_uses_the_demo_profile():
    need(shutil.which("make") is not None, "make")
    out = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert "ANCHORAGE_SETUP_PROFILE=demo bash scripts/setup.sh" in out, out
    test = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    assert "ANCHORAGE_SETUP_PROFILE" not in test and "bash scripts/setup.sh" in test


def _run(tmp_path, profile: str) -> list[str]:
    venv = tmp_path / f"venv-{profile}"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    log = tmp_path / f"{profile}.log"
    log.unlink(missing_ok=True)
    for tool in ("python", "pip"):
        p = venv / "bin" / tool
        p.write_text(STUB.format(log=log))
        p.chmod(0o755)
    # an empty Kubernetes cache: a k8s step would start a build, which this must not do
    env = dict(os.environ, ANCHORAGE_VENV=str(venv), ANCHORAGE_SETUP_PROFILE=profile,
               ANCHORAGE_K8S_CACHE=str(tmp_path / "no-k8s"), PATH=f"{venv / 'bin'}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"environment ready ({profile})" in proc.stdout
    return log.read_text().splitlines() if log.exists() else []


def test_demo_profile_installs_the_demo_extras_only(tmp_path):
    need(shutil.which("prometheus") is not None, "prometheus on PATH (else the step installs it)",
         "apt-get install prometheus")
    calls = _run(tmp_path, "demo")
    installs = [c for c in calls if c.startswith("pip install")]
    assert installs == ["pip install --progress-bar on -e .",
                        "pip install --progress-bar on -e .[cpu,router]"], calls
    assert not (tmp_path / "no-k8s").exists()            # no Kubernetes build
    # a second run finds its stamps and installs nothing
    assert not [c for c in _run(tmp_path, "demo") if c.startswith("pip install")]


def test_core_profile_and_a_bad_profile(tmp_path):
    assert [c for c in _run(tmp_path, "core") if c.startswith("pip install")] == [
        "pip install --progress-bar on -e ."]
    p = subprocess.run(["bash", "scripts/setup.sh"], cwd=REPO, capture_output=True, text=True,
                       env=dict(os.environ, ANCHORAGE_SETUP_PROFILE="everything",
                                ANCHORAGE_VENV=str(tmp_path / "v")))
    assert p.returncode == 2 and "must be core, demo or full" in p.stderr
    assert not (tmp_path / "v").exists()
