"""Tiny jobs for the harness tests (module-level: Ray workers and forked pools import or
inherit them)."""

from __future__ import annotations

import os
import time

CALLS: list[dict] = []  # jobs run in this process (inline runs)


def square(job: dict) -> dict:
    """``x`` squared, with the process that computed it; ``sleep_s`` finishes jobs out of
    order."""
    time.sleep(job.get("sleep_s", 0.0))
    CALLS.append(job)
    return {"x": job["x"], "y": job["x"] ** 2, "pid": os.getpid()}
