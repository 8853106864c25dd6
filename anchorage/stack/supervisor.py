"""Child processes of one stack: each started in its own process group (its own session),
logged to a file, health-checked over HTTP, restarted with back-off when it dies, and
stopped with everything it spawned.

A child's process tree is its process group plus every descendant seen while it ran
(recorded with its start time, so a reused pid is never signalled): children that left
the group (a daemon's own session) or were re-parented are still found.

- ``tick()`` (called every half second once the stack is up) handles deaths: a child that
  exited is reported with its real exit status (``killed by SIGKILL``, ``exited with
  status 1``), its whole tree is reaped (SIGTERM, then SIGKILL after ``reap_s``: an engine
  API server killed outright leaves its engine core and workers behind, and they ignore
  SIGTERM while busy), and it is started again after the back-off of
  ``anchorage.stack.restart`` (which also decides when to give up). A restarted child is
  running again when its health check answers.
- ``stop_all`` sends SIGTERM to each child alone (reverse start order: Prometheus and the
  router first, engines last) and waits, then SIGTERM to their process trees, then
  SIGKILL to what is left."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from anchorage.stack.restart import AUX, ROLES, RestartPolicy

STARTING, RUNNING, REAPING, WAITING, GIVEN_UP = "starting", "running", "reaping", "waiting", "given up"


class StartError(RuntimeError):
    """A piece of the stack did not start: a one-line message naming it and its log;
    ``tail`` holds the log's last lines for the caller to show."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


def _stat(pid: int | str) -> tuple[str, list[str]]:
    """``/proc/<pid>/stat``: the process's name and the fields after it (its state first).
    OSError when the process is gone; ValueError or IndexError for a cut file."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        head, rest = fh.read().decode(errors="replace").rsplit(")", 1)
    return head.split("(", 1)[1], rest.split()


def proc_table() -> dict[int, tuple[int, int, int]]:
    """Every live process: pid -> (parent pid, process group, start time in ticks)."""
    out: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = _stat(entry)[1]
            if f[0] in ("Z", "X"):
                continue
            out[int(entry)] = (int(f[1]), int(f[2]), int(f[19]))
        except (OSError, IndexError, ValueError):
            continue
    return out


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_times(pids) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds (user + system, every thread) of each live process of ``pids``:
    (pid, start time in ticks) -> (its name, seconds). Processes that exit are skipped."""
    out = {}
    for pid in pids:
        try:
            name, f = _stat(pid)
            out[(pid, int(f[19]))] = (name, (int(f[11]) + int(f[12])) * _TICK_S)
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_used(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """CPU seconds each child's processes used between two ``Supervisor.cpu`` readings,
    per child and process name (a process started in between counts from zero; one that
    exited in between is missing from ``after`` and not counted)."""
    out: dict[str, dict[str, float]] = {}
    for child, procs in after.items():
        was = before.get(child, {})
        per = out.setdefault(child, {})
        for key, (name, s) in procs.items():
            used = s - was.get(key, (name, 0.0))[1]
            per[name] = round(per.get(name, 0.0) + used, 2)
    return out


def descendants(pid: int, table: dict[int, tuple[int, int, int]] | None = None) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), children first."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for p, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        return _stat(pid)[1][0] not in ("Z", "X")
    except (OSError, IndexError, ValueError):
        return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def describe_exit(returncode: int) -> str:
    """A child's exit status in words: ``killed by SIGKILL``, ``exited with status 1``;
    statuses above 128 are a wrapper's report of a process it ran killed by a signal."""
    def name(n: int) -> str | None:
        try:
            return signal.Signals(n).name
        except ValueError:
            return None
    if returncode < 0:
        return f"was killed by {name(-returncode) or f'signal {-returncode}'}"
    if returncode > 128 and name(returncode - 128):
        return (f"exited with status {returncode} (a process it ran was killed by "
                f"{name(returncode - 128)})")
    return f"exited with status {returncode}"


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | Path | None = None
    role: str = AUX
    ready: Callable[[], bool] | None = None      # health check (None: running is ready)
    ready_timeout_s: float = 60.0
    first_ready_s: float | None = None           # how long its first start took
    known: dict[int, int] = field(default_factory=dict)   # descendant pid -> start time
    state: str = RUNNING
    failures: int = 0                            # consecutive (restart.py)
    restarts: int = 0
    started_at: float = 0.0
    ready_at: float = 0.0
    next_start: float = 0.0
    reap_deadline: float = 0.0
    last_exit: str = ""

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + s for s in text[-lines:])

    def last_line(self, limit: int = 240) -> str:
        """The last non-blank line of the child's log, cut to ``limit`` characters: where a
        start that never became ready stopped."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - 8192))
                lines = fh.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            if line.strip():
                line = line.strip()
                return line if len(line) <= limit else line[:limit - 3] + "..."
        return ""

    @property
    def given_up(self) -> bool:
        return self.state == GIVEN_UP


class Supervisor:
    def __init__(self, log_dir: str | Path, policy: RestartPolicy | None = None,
                 reap_s: float = 5.0) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.policy = policy or RestartPolicy()
        self.reap_s = reap_s
        self.children: list[Child] = []
        self._lock = threading.RLock()
        self._stopping = False
        self._next_scan = 0.0

    # -- start ---------------------------------------------------------------------------
    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: str | Path | None = None, *, role: str = AUX,
              ready: Callable[[], bool] | None = None, ready_timeout_s: float = 60.0) -> Child:
        if role not in ROLES:
            raise ValueError(f"unknown child role {role!r}; known: {', '.join(ROLES)}")
        log = self.log_dir / (name.replace(" ", "-") + ".log")
        child = Child(name, self._spawn(name, argv, env, cwd, log), log, list(argv), env, cwd,
                      role, ready, ready_timeout_s, started_at=time.monotonic())
        self.children.append(child)
        return child

    @staticmethod
    def _spawn(name: str, argv: list[str], env, cwd, log: Path) -> subprocess.Popen:
        fh = open(log, "ab")
        try:
            # start_new_session: its own session and process group (pgid == pid), so the
            # whole group is signalled on stop and on its death, and a Ctrl-C in the
            # terminal reaches only `anchorage up`, which stops the children in order
            return subprocess.Popen(argv, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise StartError(f"{name}: cannot run {argv[0]}: {exc.strerror or exc}") from None
        finally:
            fh.close()

    def wait_ready(self, child: Child, check: Callable[[], bool], timeout_s: float,
                   on_wait: Callable[[float], None] | None = None) -> float:
        """Poll ``check`` until true; StartError when the process exits or time runs out.
        ``check`` becomes the child's health check for its restarts."""
        if child.ready is None:
            child.ready, child.ready_timeout_s = check, timeout_s
        t0 = time.monotonic()
        while True:
            self.remember(child)
            if check():
                child.ready_at = time.monotonic()
                if child.first_ready_s is None:
                    child.first_ready_s = child.ready_at - child.started_at
                return child.ready_at - t0
            if child.proc.poll() is not None:
                raise StartError(f"{child.name} {describe_exit(child.proc.returncode)} "
                                 f"while starting (log: {child.log})", child.tail())
            if time.monotonic() - t0 > timeout_s:
                raise StartError(f"{child.name} not ready after {timeout_s:.0f} s "
                                 f"(log: {child.log})", child.tail())
            if on_wait:
                on_wait(time.monotonic() - t0)
            time.sleep(0.5)

    # -- process trees -------------------------------------------------------------------
    def remember(self, child: Child, table: dict | None = None) -> None:
        """Record the child's current descendants (so those that leave its process group
        or get re-parented are still stopped)."""
        if child.proc.poll() is None:
            table = proc_table() if table is None else table
            child.known = {p: st for p, st in child.known.items()   # forget the dead
                           if p in table and table[p][2] == st}
            for pid in descendants(child.proc.pid, table):
                child.known.setdefault(pid, table[pid][2])

    def tree(self, child: Child, table: dict | None = None) -> list[int]:
        """The child's live processes: itself, its process group, recorded descendants."""
        table = proc_table() if table is None else table
        pgid = child.proc.pid
        pids = {p for p, (_, pgrp, _) in table.items() if pgrp == pgid}
        pids |= {p for p, st in child.known.items() if p in table and table[p][2] == st}
        if child.proc.poll() is None:
            pids.add(child.proc.pid)
        return sorted(pids)

    def cpu(self) -> dict[str, dict[tuple[int, int], tuple[str, float]]]:
        """Per child: ``cpu_times`` of its live processes (itself and its descendants)."""
        with self._lock:
            table = proc_table()
            out = {}
            for c in self.children:
                self.remember(c, table)
                out[c.name] = cpu_times(self.tree(c, table))
            return out

    def _signal_tree(self, child: Child, sig: int, table: dict | None = None) -> list[int]:
        pids = self.tree(child, table)
        try:
            os.killpg(child.proc.pid, sig)
        except OSError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return pids

    # -- while running -------------------------------------------------------------------
    def tick(self, now: float | None = None) -> list[str]:
        """One supervision step (never blocks longer than a health check); returns one
        line per event: a death with its exit status and what happens next, a restart
        that is ready again, a give-up."""
        with self._lock:
            if self._stopping:
                return []
            now = time.monotonic() if now is None else now
            table = None
            if now >= self._next_scan or any(c.state == REAPING for c in self.children):
                table, self._next_scan = proc_table(), now + 2.0
            events: list[str] = []
            for c in self.children:
                if table is not None:
                    self.remember(c, table)
                ev = self._step(c, now, table)
                if ev:
                    events.append(ev)
            return events

    def _step(self, c: Child, now: float, table: dict | None) -> str | None:
        if c.state in (RUNNING, STARTING):
            rc = c.proc.poll()
            if rc is not None:
                return self._failed(c, describe_exit(rc), now, table)
            if c.state == STARTING:
                if c.ready is None or c.ready():
                    c.state, c.ready_at = RUNNING, now
                    return (f"{c.name} is back (restart {c.restarts}, ready "
                            f"{now - c.started_at:.0f} s after it started)")
                limit = self.policy.restart_timeout_s(c.first_ready_s, c.ready_timeout_s,
                                                      c.failures - 1)
                if now - c.started_at > limit:
                    last = c.last_line()
                    return self._failed(c, f"was not ready {limit:.0f} s after its restart"
                                        + (f" (its log last said: {last})" if last else ""),
                                        now, table)
            elif c.failures and now - c.ready_at >= self.policy.stable_s:
                c.failures = 0
        elif c.state == REAPING:
            left = self.tree(c, table)
            if left and now < c.reap_deadline:
                return None
            c.state = GIVEN_UP if self.policy.gives_up(c.failures) else WAITING
            if left:
                self._signal_tree(c, signal.SIGKILL, table)
                return f"{c.name}: {len(left)} process(es) left behind needed SIGKILL"
        elif c.state == WAITING and now >= c.next_start:
            try:
                c.proc = self._spawn(c.name, c.argv, c.env, c.cwd, c.log)
            except StartError as exc:
                return self._failed(c, f"could not be restarted ({exc})", now, table)
            c.state, c.started_at, c.known = STARTING, now, {}
            c.restarts += 1
        return None

    def _failed(self, c: Child, what: str, now: float, table: dict | None) -> str:
        c.failures += 1
        c.last_exit = what
        self._signal_tree(c, signal.SIGTERM, table)
        c.state, c.reap_deadline = REAPING, now + self.reap_s
        if self.policy.gives_up(c.failures):
            plan = f"giving up after {c.failures - 1} failed restart(s); it stays down"
        else:
            delay = self.policy.delay_s(c.failures)
            c.next_start = now + delay
            plan = f"restarting it in {delay:g} s"
        return f"{c.name} {what}; {plan} (log: {c.log})"

    def failed(self) -> list[Child]:
        """Children that are down now (dead, being reaped, waiting or given up)."""
        with self._lock:
            return [c for c in self.children if c.state not in (RUNNING, STARTING)
                    or c.proc.poll() is not None]

    # -- stop ----------------------------------------------------------------------------
    def stop_all(self, grace_s: float = 30.0, straggler_s: float = 5.0) -> list[int]:
        """Stop every child and its process tree; returns the pids that needed SIGKILL.

        1. SIGTERM to each child alone (reverse start order), so it shuts its own children
           down in order (vLLM its engine core, the router Serve and then Ray); wait up to
           ``grace_s`` for them to exit.
        2. SIGTERM to each child's process group and every recorded descendant still
           alive; wait up to ``straggler_s``.
        3. SIGKILL whatever is left."""
        with self._lock:
            self._stopping = True
            table = proc_table()
            for c in self.children:
                self.remember(c, table)
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
            table = proc_table()
            every = {p for c in self.children for p in self._signal_tree(c, signal.SIGTERM, table)}
            deadline = time.monotonic() + straggler_s
            while any(alive(p) for p in every) and time.monotonic() < deadline:
                time.sleep(0.1)
            table = proc_table()
            killed = sorted({p for c in self.children
                             for p in self._signal_tree(c, signal.SIGKILL, table)})
            for c in self.children:
                try:
                    c.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + 5
            while any(alive(p) for p in killed) and time.monotonic() < deadline:
                time.sleep(0.05)
            self.children.clear()
            self._stopping = False
            return killed
