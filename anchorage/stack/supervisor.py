"""Child processes of one stack: each started in its own process group, logged to a file,
health-checked over HTTP, and stopped with everything it spawned.

``stop_all`` sends SIGTERM to each child (reverse start order: Prometheus and the router
first, engines last) and waits, then SIGTERM to their process groups and every descendant
seen (children that left the group, e.g. Ray's), then SIGKILL to what is left."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class StartError(RuntimeError):
    """A piece of the stack did not start: a one-line message naming it and its log;
    ``tail`` holds the log's last lines for the caller to show."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().decode(errors="replace").rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    known: set[int] = field(default_factory=set)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + s for s in text[-lines:])


class Supervisor:
    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: str | Path | None = None) -> Child:
        log = self.log_dir / (name.replace(" ", "-") + ".log")
        fh = open(log, "ab")
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise StartError(f"{name}: cannot run {argv[0]}: {exc.strerror or exc}") from None
        finally:
            fh.close()
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def wait_ready(self, child: Child, check: Callable[[], bool], timeout_s: float,
                   on_wait: Callable[[float], None] | None = None) -> float:
        """Poll ``check`` until true; StartError when the process exits or time runs out."""
        t0 = time.monotonic()
        while True:
            self.remember(child)
            if check():
                return time.monotonic() - t0
            if child.proc.poll() is not None:
                raise StartError(f"{child.name} exited with status {child.proc.returncode} "
                                 f"while starting (log: {child.log})", child.tail())
            if time.monotonic() - t0 > timeout_s:
                raise StartError(f"{child.name} not ready after {timeout_s:.0f} s "
                                 f"(log: {child.log})", child.tail())
            if on_wait:
                on_wait(time.monotonic() - t0)
            time.sleep(0.5)

    def remember(self, child: Child) -> None:
        """Record the child's current descendants (so those that leave its process group
        or get re-parented are still stopped)."""
        if child.proc.poll() is None:
            child.known.update(descendants(child.proc.pid))

    def failed(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def stop_all(self, grace_s: float = 30.0, straggler_s: float = 5.0) -> list[int]:
        """Stop every child and its descendants; returns the pids that needed SIGKILL.

        1. SIGTERM to each child alone (reverse start order), so it shuts its own children
           down in order (vLLM its engine core, the router Serve and then Ray); wait up to
           ``grace_s`` for them to exit.
        2. SIGTERM to each child's process group and every recorded descendant still
           alive; wait up to ``straggler_s``.
        3. SIGKILL whatever is left."""
        for c in self.children:
            self.remember(c)
        for c in reversed(self.children):
            if c.proc.poll() is None:
                try:
                    c.proc.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + grace_s
        for c in reversed(self.children):
            try:
                c.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        every = {pid for c in self.children for pid in ({c.proc.pid} | c.known)}
        for c in self.children:
            _signal_group(c.proc.pid, signal.SIGTERM)
        for pid in every:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + straggler_s
        while any(alive(p) for p in every) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = sorted(p for p in every if alive(p))
        for c in self.children:
            _signal_group(c.proc.pid, signal.SIGKILL)
        for pid in killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for c in self.children:
            try:
                c.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 5
        while any(alive(p) for p in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.children.clear()
        return killed


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass
