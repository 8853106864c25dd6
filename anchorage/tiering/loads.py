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

``SYNC_LOAD_MAX_S`` (2 ms), the default: a step of a serving engine is tens of
milliseconds (a decode step of an 8B model on an H200, about 10-30 ms; a prefill chunk,
more), so a copy of at most 2 ms per step costs the batch a few per cent of one step,
where an asynchronous load costs its request a whole step. At the default 25 GB/s link
that is 50 MB per step: about 400 tokens of Llama-3-8B (128 KiB per token), a whole
session of a small model. Loads larger than that overlap compute, as vLLM's do.
"""

from __future__ import annotations

import math

SYNC_LOAD_MAX_S = 0.002


def sync_load(copy_s: float, step_sync_s: float, max_s: float) -> bool:
    """True: copy before this step's forward pass and prefill the request in it."""
    if not (copy_s >= 0 and step_sync_s >= 0) or math.isnan(max_s) or max_s <= 0:
        return False
    return step_sync_s + copy_s <= max_s
