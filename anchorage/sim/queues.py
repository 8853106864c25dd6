"""The waiting-queue orders and preemption victims of a simulated replica's scheduler
(``anchorage.sim.engine.Replica``; specification there and in ``anchorage.sim.retention``).

- ``order_prefix_aware``: ``admission = "prefix-aware"``: preempted requests first, in
  order, then ``anchorage.policies.admission.admission_order`` (with the replica's
  ``admission_params``); re-sorted only when a request arrived or blocks were released
  since the last sort, or a waiting request changed class (its TTFT target).
- ``order_program_fcfs``: ``admission = "program-fcfs"`` (Continuum): preempted first,
  then by the time the request's session first arrived at the replica, then arrival.
- ``victim``: the running request to preempt among those not scheduled yet this step.
"""

from __future__ import annotations

from anchorage.policies.admission import admission_order, next_change_s


def victim(rep, first: int):
    """The running request to preempt, among those not scheduled yet this step
    (``running[first:]``): the last one (vLLM), or under program-level FCFS the one
    whose session arrived last (``anchorage.sim.retention``)."""
    running = rep.running
    if rep.admission != "program-fcfs":
        return running.pop()
    start = rep._program_start
    j = max(range(first, len(running)),
            key=lambda i: (start.get(running[i].session, running[i].arrival_s), i))
    return running.pop(j)


def order_program_fcfs(rep) -> None:
    mark = (rep._arrivals, rep.pool.sim_free_epoch)
    if mark == rep._sorted_at:
        return
    rep._sorted_at = mark
    start = rep._program_start
    w = sorted(rep.waiting, key=lambda r: (r.preemptions == 0,
                                            start.get(r.session, r.arrival_s), r.arrival_s))
    rep.waiting.clear()
    rep.waiting.extend(w)


def order_prefix_aware(rep, now: float) -> None:
    """Sort ``waiting`` by ``admission_order`` (preempted requests first, in order)
    when something arrived or was released since the last sort."""
    pool = rep.pool
    mark = (rep._arrivals, pool.sim_free_epoch)
    if mark == rep._sorted_at and now < rep._resort_at:
        return
    rep._sorted_at = mark
    params = rep.admission_params
    resume = [r for r in rep.waiting if r.preemptions > 0]
    rest = [r for r in rep.waiting if r.preemptions == 0]
    rep._resort_at = next_change_s((r.arrival_s for r in rest), now, params)
    if len(rest) > 1:
        rest = admission_order(
            rest, lambda r: (pool.blocks_needed(r.prefill_target)
                             - pool.num_hit_blocks(r.ctx.keys, r.ctx.input_length)),
            lambda r: r.arrival_s, now, params=params)
    w = rep.waiting
    w.clear()
    w.extend(resume)
    w.extend(rest)
