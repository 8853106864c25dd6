"""ThunderAgent's program-aware capacity scheduler (pause/resume of agent programs by KV
capacity), as a pure object over plain numbers.

Spec (HaoKang-Timmy/ThunderAgent ``ThunderAgent/scheduler/router.py``
``MultiBackendRouter``, ``ThunderAgent/backend/state.py`` ``BackendState``; wiki
``Scheduler.md``). A *program* is a session; each has ``tokens`` (its context: the last
request's prompt plus output) and a status, ``reasoning`` (a request in flight) or
``acting`` (in a tool call). Per backend (replica) with ``capacity`` KV tokens:

- ``used = reasoning + acting_weight * acting - shared + 100 * programs`` (the sums of the
  programs' tokens on it by status; ``shared`` = reasoning tokens - the tokens the engine
  really holds, its prefix-cache saving, refreshed at every check; 100 tokens of decode
  headroom per program, ``BUFFER_PER_PROGRAM``); ``remaining = capacity - used``.
- A new program's first request is placed on the backend with the fewest active program
  tokens among those with ``remaining >= tokens + 100``, only while no program is paused;
  otherwise it waits in the paused pool. A known program's request goes to its backend,
  or waits while the program is paused.
- Every ``interval_s`` (``check(now, held_tokens)``): each backend over capacity
  (``remaining < 0``) pauses ``acting`` programs, fewest tokens first (they leave the
  backend), then *marks* ``reasoning`` programs, fewest first (paused when their request
  completes), until within capacity; then paused programs are resumed by best-fit
  decreasing: candidates in priority order (paused with a request waiting, then new
  programs, then paused while acting), each placed, largest first, on the backend with
  the most remaining capacity if it has room (``remaining > 100`` to be considered).
- A program paused longer than ``timeout_s`` (30 min) is resumed on the least loaded
  backend whatever its room. ``release(program)`` forgets a finished session.

Returns of ``arrive``: a backend index, or None (the request waits). ``check`` returns
``(program, backend)`` for each resumed program whose request is waiting.
Parameters: ``interval_s`` 5.0 (``--scheduler-interval``), ``acting_weight`` 1.0
(``--acting-token-weight``), ``buffer_tokens`` 100, ``timeout_s`` 1800.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

REASONING, ACTING = "reasoning", "acting"


@dataclass
class Program:
    pid: Hashable
    tokens: int = 0
    status: str = REASONING
    backend: int | None = None
    paused: bool = False
    paused_at: float = 0.0
    paused_from: str | None = None
    marked: bool = False
    steps: int = 0
    waiting: bool = False          # a request of this program waits for resume


@dataclass
class Backend:
    capacity: int
    programs: set = field(default_factory=set)
    shared: int = 0
    future_paused: int = 0


class ThunderAgentScheduler:
    def __init__(self, capacities: Sequence[int], interval_s: float = 5.0,
                 acting_weight: float = 1.0, buffer_tokens: int = 100,
                 timeout_s: float = 1800.0) -> None:
        if interval_s <= 0 or acting_weight < 0 or buffer_tokens < 0:
            raise ValueError("interval_s must be > 0, acting_weight and buffer_tokens >= 0")
        self.backends = [Backend(int(c)) for c in capacities]
        self.interval_s = interval_s
        self.acting_weight = acting_weight
        self.buffer = buffer_tokens
        self.timeout_s = timeout_s
        self.programs: dict[Hashable, Program] = {}
        self.paused: dict[Hashable, Program] = {}   # insertion order = pause order
        self.pauses = self.resumes = 0

    # -- accounting ---------------------------------------------------------------------

    def _sum(self, b: Backend, status: str) -> int:
        return sum(self.programs[p].tokens for p in b.programs
                   if self.programs[p].status == status)

    def active_tokens(self, i: int) -> float:
        b = self.backends[i]
        return self._sum(b, REASONING) + self.acting_weight * self._sum(b, ACTING)

    def remaining(self, i: int) -> float:
        b = self.backends[i]
        used = self.active_tokens(i) - b.shared + self.buffer * len(b.programs)
        return b.capacity - used

    def _register(self, prog: Program, i: int) -> None:
        prog.backend = i
        prog.paused = False
        self.backends[i].programs.add(prog.pid)

    def _pause(self, prog: Program, now: float) -> None:
        self.backends[prog.backend].programs.discard(prog.pid)
        prog.paused_from = prog.status
        prog.paused = True
        prog.paused_at = now
        self.paused[prog.pid] = prog
        self.pauses += 1

    # -- request events -----------------------------------------------------------------

    def arrive(self, pid: Hashable, tokens: int, now: float) -> int | None:
        prog = self.programs.get(pid)
        if prog is None:
            prog = self.programs[pid] = Program(pid)
        prog.steps += 1
        prog.tokens = int(tokens)
        if prog.paused:
            prog.waiting = True
            return None
        if prog.backend is None:
            best = None
            if not self.paused:
                need = prog.tokens + self.buffer
                fits = [i for i in range(len(self.backends)) if self.remaining(i) >= need]
                if fits:
                    best = min(fits, key=lambda i: (self.active_tokens(i), i))
            if best is None:
                prog.paused, prog.paused_at, prog.paused_from = True, now, None
                prog.waiting = True
                self.paused[pid] = prog
                return None
            self._register(prog, best)
        prog.status = REASONING
        return prog.backend

    def finished(self, pid: Hashable, tokens: int, now: float) -> None:
        """A request of ``pid`` completed: the program acts (its tool runs)."""
        prog = self.programs.get(pid)
        if prog is None:
            return
        prog.status = ACTING
        prog.tokens = int(tokens)
        if prog.marked and not prog.paused:
            prog.marked = False
            b = self.backends[prog.backend]
            b.future_paused = max(0, b.future_paused - prog.tokens)
            self._pause(prog, now)

    def release(self, pid: Hashable) -> None:
        prog = self.programs.pop(pid, None)
        if prog is None:
            return
        self.paused.pop(pid, None)
        if prog.backend is not None:
            self.backends[prog.backend].programs.discard(pid)

    # -- the periodic check -------------------------------------------------------------

    def check(self, now: float, held_tokens: Sequence[int]) -> list[tuple[Hashable, int]]:
        """Pause over-capacity backends, resume what fits; refresh the shared tokens from
        the engines' held tokens (``held_tokens[i]``) for the next check."""
        for i in range(len(self.backends)):
            self._pause_until_safe(i, now)
        out = self._resume(now)
        for i, b in enumerate(self.backends):
            b.shared = max(0, self._sum(b, REASONING) - int(held_tokens[i]))
        return out

    def _pause_until_safe(self, i: int, now: float) -> None:
        b = self.backends[i]
        while self.remaining(i) + b.future_paused < 0:
            progs = [self.programs[p] for p in b.programs]
            acting = sorted((p for p in progs if p.status == ACTING),
                            key=lambda p: (p.tokens, str(p.pid)))
            if acting:
                self._pause(acting[0], now)
                continue
            reasoning = sorted((p for p in progs if p.status == REASONING and not p.marked),
                               key=lambda p: (p.tokens, str(p.pid)))
            if not reasoning:
                break
            reasoning[0].marked = True
            b.future_paused += reasoning[0].tokens

    def _resume(self, now: float) -> list[tuple[Hashable, int]]:
        out: list[tuple[Hashable, int]] = []
        if not self.paused:
            return out
        order = {"first": [], "new": [], "acting": []}
        for prog in self.paused.values():
            if prog.steps <= 1 and prog.paused_from is None:
                order["new"].append(prog)
            elif prog.paused_from == REASONING or prog.waiting:
                order["first"].append(prog)
            else:
                order["acting"].append(prog)
        chosen = order["first"] + order["new"] + order["acting"]
        chosen.sort(key=lambda p: -p.tokens)  # best fit decreasing
        for prog in chosen:
            room = [(self.remaining(i), -i) for i in range(len(self.backends))]
            best_room, neg_i = max(room)
            overdue = now - prog.paused_at >= self.timeout_s
            if overdue:
                neg_i = -min(range(len(self.backends)), key=lambda i: (self.active_tokens(i), i))
            elif best_room <= self.buffer or best_room < prog.tokens + self.buffer:
                continue
            del self.paused[prog.pid]
            self._register(prog, -neg_i)
            prog.status = prog.paused_from or REASONING
            self.resumes += 1
            if prog.waiting:
                prog.waiting = False
                prog.status = REASONING
                out.append((prog.pid, prog.backend))
        return out
