"""Program gates: decisions above the router about whether a session's next request may
run now, and where (the simulator's adapters).

Specification
-------------
A gate sits between a request's arrival and the replicas: ``route(req, now)`` returns the
replica the request goes to, or None (it waits in the gate); ``completed(req, now)`` is
told of every completed request, ``ended(session)`` of every session that sent its last
request; ``check(now)`` runs every ``interval_s`` of simulated time and returns the
``(request, replica)`` pairs it releases. A stack with a gate has no router: the gate
places programs itself.

``thunderagent`` (``anchorage.routing.thunderagent.ThunderAgentScheduler``): per replica
``capacity = capacity_blocks * block_size`` KV tokens; a request's program tokens are its
prompt at arrival and prompt plus output when it completes; the engine's held tokens are
the blocks in use (``capacity - num_free_blocks``) times the block size. Requests without
a session bypass the gate (the least loaded replica). Parameters: those of the scheduler.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from anchorage.routing.thunderagent import ThunderAgentScheduler

PROGRAM_GATES = ("none", "thunderagent")


class ThunderAgentGate:
    def __init__(self, replicas, **params: Any) -> None:
        self.replicas = replicas
        self.bs = replicas[0].pool.block_size
        caps = [r.pool.capacity_blocks * self.bs for r in replicas]
        self.sched = ThunderAgentScheduler(caps, **params)
        self.interval_s = self.sched.interval_s
        self.held: dict[Hashable, Any] = {}

    def route(self, req, now: float) -> int | None:
        if req.session is None:
            return min(range(len(self.replicas)),
                       key=lambda i: (len(self.replicas[i].running)
                                      + len(self.replicas[i].waiting), i))
        i = self.sched.arrive(req.session, req.prompt_len, now)
        if i is None:
            self.held[req.session] = req
        return i

    def completed(self, req, now: float) -> None:
        if req.session is not None:
            self.sched.finished(req.session, req.prompt_len + req.output_len, now)

    def ended(self, session: Hashable) -> None:
        self.sched.release(session)
        self.held.pop(session, None)

    def check(self, now: float) -> list[tuple[Any, int]]:
        held = [(r.pool.capacity_blocks - r.pool.num_free_blocks) * self.bs
                for r in self.replicas]
        out = []
        for pid, i in self.sched.check(now, held):
            req = self.held.pop(pid, None)
            if req is not None:
                out.append((req, i))
        return out

    @property
    def busy(self) -> bool:
        return bool(self.held) or bool(self.sched.paused)

    def counters(self) -> dict[str, int]:
        return {"pauses": self.sched.pauses, "resumes": self.sched.resumes}


def make_gate(name: str, replicas, params: dict | None = None):
    if name == "none":
        return None
    if name == "thunderagent":
        try:
            return ThunderAgentGate(replicas, **(params or {}))
        except TypeError as exc:
            raise ValueError(f"bad parameters for program gate {name!r}: {exc}") from None
    raise ValueError(f"unknown program gate {name!r}; known: {', '.join(PROGRAM_GATES)}")
