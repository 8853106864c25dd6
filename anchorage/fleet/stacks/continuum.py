"""``continuum``: Continuum's TTL pins and program-level FCFS (an engine scheduler, no
router of its own: here behind the production stack's session router).

Sources: Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with
KV Cache Time-to-Live" (arXiv:2511.02230); the released scheduler (``vllm-continuum``
``vllm/v1/core/estimate_with_func.py``: pin for 2 s after a tool call whose mean observed
duration is at most 2 s; ``vllm/v1/core/sched/scheduler.py``: unpin on expiry when the
job has no waiting request, policy ``continuum``: job-level FCFS; retention
``continuum``, admission ``program-fcfs``). No host tier (offloading is optional in the
paper). Prefill chunks capped at 2,048 tokens (``spec.PREFILL_CAP``; vllm-continuum is a vLLM
fork with the flag; ``continuum-no-prefill-cap``: without).
"""

from anchorage.fleet.spec import PREFILL_CAP, StackSpec

STACKS = {"continuum": StackSpec(
    name="continuum", peer="Continuum (TTL pins, program FCFS) + session routing",
    source="arXiv:2511.02230; vllm-continuum estimate_with_func.py set_up_pin "
           "(2 s threshold and TTL), sched/scheduler.py (job-level FCFS)",
    router="session_affinity", policy="lru", admission="program-fcfs",
    retention="continuum", long_prefill_tokens=PREFILL_CAP)}
