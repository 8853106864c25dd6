"""``stock``: vLLM as it ships, behind a round-robin load balancer (a Kubernetes Service).

Source: vLLM v1 (``vllm/v1/core/block_pool.py``: the free queue is the LRU eviction order;
``vllm/v1/core/sched/scheduler.py``: FCFS admission, recompute preemption); no KV
connector, so no host tier.
"""

from anchorage.fleet.spec import StackSpec

STACKS = {"stock": StackSpec(
    name="stock", peer="vLLM + round robin",
    source="vllm v1 block_pool.py (LRU free queue), sched/scheduler.py (FCFS); "
           "Kubernetes Service round robin",
    router="round_robin", policy="lru", admission="fcfs")}
