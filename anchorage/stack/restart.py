"""When a stack's child process that died is started again, and when the stack gives up.

Specification (pure; the supervisor calls it with what it observed):

- ``failures``: a child's consecutive failures. A failure is an exit the stack did not ask
  for, or a restart that did not become ready within its timeout. The count goes back to 0
  once the child has been ready for ``stable_s`` without failing.
- After failure ``k`` (k >= 1) the child is started again after
  ``delay_s(k) = min(backoff_max_s, backoff_s * 2 ** (k - 1))`` seconds: 1, 2, 4, 8, 16, 30,
  30 ... with the defaults.
- The stack gives up on a child after ``max_restarts`` restarts failed in a row, i.e. when
  ``failures > max_restarts``; a given-up child stays down.
- A restart is given ``restart_timeout_s(first_ready_s, timeout_s, failed) = min(timeout_s,
  max(hung_start_min_s, hung_start_factor * first_ready_s) * 2 ** failed)`` to become
  ready, where ``first_ready_s`` is how long the child's first start took (unknown:
  ``timeout_s``) and ``failed`` how many restarts in a row before this one were not ready in
  time: a start that takes several times longer than the first one is taken for hung (seen:
  a restarting vLLM engine that got no CPU behind a busy engine pinned to the same core,
  ``anchorage.stack.engines``) and is restarted rather than waited for; each such restart
  in a row gets twice the time of the one before, so a start that is only slow (a busy
  machine) still comes up instead of being cut off at the same point again and again.
- The stack can serve while its router is not given up and at least one engine is not
  given up (node agents and Prometheus are optional to serving); ``anchorage up`` ends
  only on Ctrl-C/SIGTERM or when it cannot serve. A child waiting for its restart still
  counts as able to serve: it comes back.

Parameters (``RestartPolicy``, defaults in brackets): ``backoff_s`` first delay [1.0],
``backoff_max_s`` the longest delay [30.0], ``stable_s`` ready time that clears the count
[60.0], ``max_restarts`` failed restarts in a row before giving up [5],
``hung_start_factor`` [4.0] and ``hung_start_min_s`` [120.0]."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

ENGINE, ROUTER, AUX = "engine", "router", "aux"
ROLES = (ENGINE, ROUTER, AUX)


@dataclass(frozen=True)
class RestartPolicy:
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    stable_s: float = 60.0
    max_restarts: int = 5
    hung_start_factor: float = 4.0
    hung_start_min_s: float = 120.0

    def __post_init__(self) -> None:
        if self.hung_start_factor < 1 or self.hung_start_min_s <= 0:
            raise ValueError("hung_start_factor must be >= 1 and hung_start_min_s positive, "
                             f"got {self.hung_start_factor} and {self.hung_start_min_s}")
        if not 0 < self.backoff_s <= self.backoff_max_s:
            raise ValueError(f"restart back-off must satisfy 0 < backoff_s <= backoff_max_s, "
                             f"got {self.backoff_s} and {self.backoff_max_s}")
        if self.stable_s <= 0:
            raise ValueError(f"stable_s must be positive, got {self.stable_s}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> "RestartPolicy":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown restart parameter(s) {', '.join(unknown)}; known: "
                             + ", ".join(sorted(known)))
        return cls(**d)  # type: ignore[arg-type]

    def delay_s(self, failures: int) -> float:
        """Seconds to wait before restarting a child after its ``failures``-th failure."""
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** max(0, failures - 1))

    def restart_timeout_s(self, first_ready_s: float | None, timeout_s: float,
                          failed: int = 0) -> float:
        """Seconds a restarted child gets to become ready, after ``failed`` restarts in a row
        that were not (module spec)."""
        if first_ready_s is None:
            return timeout_s
        base = max(self.hung_start_min_s, self.hung_start_factor * first_ready_s)
        return min(timeout_s, base * 2.0 ** max(0, failed))

    def gives_up(self, failures: int) -> bool:
        return failures > self.max_restarts


def can_serve(children: Iterable[tuple[str, bool]]) -> bool:
    """``children``: (role, given_up) per child. True while the router and one engine live."""
    router = engine = False
    for role, given_up in children:
        if given_up:
            continue
        router |= role == ROUTER
        engine |= role == ENGINE
    return router and engine
