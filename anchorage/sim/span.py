"""Decode spans: several pure-decode engine steps simulated as one event.

Specification
-------------
A step that only decodes (no prefill chunk, nothing admitted, nothing preempted) leaves
the replica's state unchanged except for each running request's token count, so the next
steps are predictable until something outside the batch happens. ``extend(rep, plan,
now)`` turns such a step into a *span* of ``k`` consecutive decode steps when all of
these hold (otherwise the plan is returned as it was, ``k = 1``):

- every item of the plan decodes, none prefills, and every running request is in it
  (none waits for a host-tier reload);
- the waiting queue is empty, or admission stopped on a request that cannot be
  allocated (``Replica._blocked`` at the pool's current free epoch) or on
  ``max_num_seqs``: without a release (a completion or a preemption), which a span never
  contains, the next steps would not admit anything either.

``k`` is the smallest of: the steps until the first running request completes (that step
is the span's last), ``max_steps`` (default 4096), the steps until the first step end at
or after ``horizon_s`` (the tiering adapter's next due transfer, hold release or spatial
update, ``SimTiering.next_due_s``; the span ends where the per-step simulation would next
act on it), and the largest ``k`` (halving) whose growth fits the pool's free blocks
(``BlockPool.num_free_blocks``, evictable cached blocks included). The blocks the ``k``
steps need are allocated when the span is planned (``BlockPool.grow``; vLLM allocates them
a step at a time: a reservation at most one block per request early).

Step durations are ``anchorage.sim.costmodel.decode_step_s`` for contexts ``c_r + j``
(``j = 0..k-1``; ``decode_span_ends``, equal up to rounding), accumulated step by step as
the event loop would (``ends``). An arrival
routed to a replica in a span ends the span at the first step end at or after the arrival
(``truncate``), as the per-step loop would next plan there; the steps after it are not
simulated, their reserved blocks stay with their requests. ``finish_step`` applies ``k``
tokens to each request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anchorage.sim.costmodel import decode_span_ends, step_time_s

if TYPE_CHECKING:
    from anchorage.sim.engine import Replica, StepPlan

MAX_SPAN_STEPS = 4096


def spannable(rep: "Replica", plan: "StepPlan", stalled: bool) -> bool:
    """The plan decodes every running request and admission is stalled (see module)."""
    if rep.cost is not step_time_s or not plan.items:
        return False
    if len(plan.items) != len(rep.running):
        return False
    for _, n, prefilling in plan.items:
        if prefilling or n != 1:
            return False
    return not rep.waiting or stalled


def extend(rep: "Replica", plan: "StepPlan", now: float, horizon_s: float = float("inf"),
           max_steps: int = MAX_SPAN_STEPS) -> "StepPlan":
    items = plan.items
    k = max_steps
    for r, _, _ in items:
        left = r.output_len - r.num_output
        if left < k:
            k = left
    if k <= 1:
        return plan
    prof = rep.profile
    ctx_sum = 0
    for r, _, _ in items:
        ctx_sum += r.num_computed
    ends = decode_span_ends(prof, len(items), ctx_sum, k, now, horizon_s)
    k = len(ends)
    pool, bs = rep.pool, rep.bs
    while k > 1:
        need = 0
        for r, _, _ in items:
            need += pool.blocks_needed(r.num_computed + k) - len(r.alloc.blocks)
        if need <= pool.num_free_blocks:
            break
        k //= 2
    if k <= 1:
        return plan
    for r, _, _ in items:
        if r.num_computed + k > len(r.alloc.blocks) * bs:
            pool.grow(r.alloc, r.num_computed + k)
    plan.steps = k
    plan.ends = ends[:k]
    plan.duration_s = plan.ends[-1] - now
    return plan


def truncate(plan: "StepPlan", t: float) -> bool:
    """End the span at the first step end at or after ``t``; True if it got shorter."""
    if plan.steps <= 1 or plan.ends[-1] <= t:
        return False
    ends = plan.ends
    j = 0
    while ends[j] < t:
        j += 1
    if j + 1 >= plan.steps:
        return False
    plan.steps = j + 1
    del ends[j + 1:]
    plan.duration_s = ends[-1] - plan.start_s
    return True
