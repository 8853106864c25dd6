"""Small builders for routing tests."""

from __future__ import annotations

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView

_n = [0]


def ctx(keys, session=None, tenant=None, agent=None, now=0.0) -> RequestContext:
    _n[0] += 1
    return RequestContext(request_id=_n[0], keys=list(keys), input_length=len(keys) * 16 + 1,
                          session_id=session, tenant=tenant, agent_hint=agent, now_s=now)


def views(n, loads=None, healthy=None, capacity=1000, kv=None, extra=None):
    out = []
    for i in range(n):
        out.append(ReplicaView(index=i, name=f"r{i}", running=(loads or [0] * n)[i],
                               healthy=True if healthy is None else healthy[i],
                               capacity_blocks=capacity, kv_usage=(kv or [0.0] * n)[i],
                               extra=(extra or [{}] * n)[i]))
    return out


def route(router, c, reps):
    p = router.pick(c, reps)
    router.on_start(c, reps[p].index)
    return p
