"""A peer's router in place of Anchorage's, for same-machine comparisons: the SGLang model
gateway (``smg``, PyPI, a Rust binary in the wheel) in front of the stack's engines.

A stack's ``router`` setting ``smg`` or ``smg:POLICY`` starts ``smg launch --host
127.0.0.1 --port PORT --backend vllm --policy POLICY --worker-urls URL ...`` instead of
the Ray Serve router (``POLICY`` defaults to ``cache_aware``, the gateway's prefix-aware
policy, with its own default thresholds: nothing here tunes it). The gateway binds
loopback only; its readiness is ``GET /health`` (it has no ``/healthz``). It takes text
and chat prompts only (token-id prompts are a 400), so a workload goes through it as
``--prompt-format text`` or ``chat`` over engines with a tokenizer (``--tiny-model
chat``).

The binary is ``$ANCHORAGE_SMG`` when set, else ``.venv-smg/bin/smg`` in the project
(``scripts/setup.d/50-bench-router.sh`` installs it there, in its own virtualenv), else
``smg`` on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

PREFIX = "smg"
DEFAULT_POLICY = "cache_aware"
# `smg launch --policy` choices (smg 1.13)
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "least_load",
            "consistent_hashing", "prefix_hash")
HEALTH_PATH = "/health"
ROOT = Path(__file__).resolve().parents[2]


def policy_of(router: str) -> str | None:
    """``smg`` / ``smg:POLICY`` -> the gateway's policy; None for any other router name
    (Anchorage's own). An unknown gateway policy is a ValueError naming the known ones."""
    name, sep, policy = router.partition(":")
    if name != PREFIX:
        return None
    policy = policy if sep else DEFAULT_POLICY
    if policy not in POLICIES:
        raise ValueError(f"unknown smg policy {policy!r}; known: {', '.join(POLICIES)}")
    return policy


def binary() -> str | None:
    """The gateway's executable (module docstring), or None when it is not installed."""
    env = os.environ.get("ANCHORAGE_SMG")
    if env:
        return env if os.access(env, os.X_OK) else None
    local = ROOT / ".venv-smg" / "bin" / "smg"
    if os.access(local, os.X_OK):
        return str(local)
    return shutil.which("smg")


def command(exe: str, policy: str, port: int, worker_urls: list[str]) -> list[str]:
    return [exe, "launch", "--host", "127.0.0.1", "--port", str(port), "--backend", "vllm",
            "--policy", policy, "--worker-urls", *worker_urls]
