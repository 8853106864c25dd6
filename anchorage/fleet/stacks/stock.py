"""``stock``: vLLM as it ships, behind a round-robin load balancer (a Kubernetes Service).

Source: vLLM v1 (``vllm/v1/core/block_pool.py``: the free queue is the LRU eviction order;
``vllm/v1/core/sched/scheduler.py``: FCFS admission, recompute preemption); no KV
connector, so no host tier. Prefill chunks capped at 2,048 tokens per request per step
(``--long-prefill-token-threshold``, ``spec.PREFILL_CAP``: a flag of vLLM's own, set for
every stack of the table; ``stock-no-prefill-cap`` is vLLM's default, none).
"""

from anchorage.fleet.spec import PREFILL_CAP, StackSpec

STACKS = {"stock": StackSpec(
    name="stock", peer="vLLM + round robin",
    source="vllm v1 block_pool.py (LRU free queue), sched/scheduler.py (FCFS); "
           "Kubernetes Service round robin",
    router="round_robin", policy="lru", admission="fcfs", long_prefill_tokens=PREFILL_CAP)}
