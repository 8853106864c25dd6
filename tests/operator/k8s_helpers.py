"""Shared helpers for the operator's tests against the real API server (polling, objects)."""

from __future__ import annotations

import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "manifests" / "crd"
G, V, P = "anchorage.dev", "v1alpha1", "agentcachepolicies"


def poll(fn, what: str, timeout_s: float = 90.0, every_s: float = 0.5):
    """Call ``fn`` until it returns something truthy; fail with its last result or error."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001  (report the last error if it never settles)
            last = e
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def deployment(name: str, namespace: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "vllm",
                                                           "image": "vllm/vllm-openai"}]}}}}
