"""Small process and port helpers for the loopback services tests start."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable

from anchorage.stack import ports


def free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range, so no process started
    meanwhile is handed it (``anchorage.stack.ports.free_port``)."""
    return ports.free_port()


def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = 60.0,
               proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll ``pred`` until true; fail with the process log's tail when it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except Exception:
            pass
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = ""
    if log is not None and log.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise RuntimeError(f"{what} did not become ready" +
                       (f" (exited {proc.returncode})" if proc is not None and proc.poll() is not None else "")
                       + (f"; log tail:\n{tail}" if tail else ""))


def stop(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def spawn(cmd: list[str], log: Path, **kw) -> subprocess.Popen:
    fh = open(log, "wb")
    try:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, **kw)
    finally:
        fh.close()
