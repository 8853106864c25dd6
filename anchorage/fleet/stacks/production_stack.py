"""``production-stack``: the vLLM production stack: session routing, LMCache offloading
every request's KV to host memory.

Sources: vllm-project/production-stack ``src/vllm_router/routers/routing_logic.py``
(``SessionRouter``: a consistent-hash ring on the session id, no load bound, lowest QPS
without one; router ``session_affinity``); LMCache's local CPU backend
(``LMCacheConnectorV1``): every request's KV chunks are stored to host memory as they are
computed (incremental, LRU) and retrieved on a prefix hit at scheduling (tiering
``store-all``), synchronously: vLLM's ``LMCacheConnectorV1.get_num_new_matched_tokens``
returns ``load_async`` False, so the hit is loaded before the forward pass of the step
that schedules the request (``sync_load_max_s`` inf); the GPU cache stays vLLM's LRU.
"""

import math

from anchorage.fleet.spec import StackSpec

STACKS = {"production-stack": StackSpec(
    name="production-stack", peer="vLLM production-stack + LMCache",
    source="production-stack routing_logic.py SessionRouter (HashRing, lowest QPS); "
           "LMCache LMCacheConnectorV1 local CPU backend (store every chunk, LRU)",
    router="session_affinity", policy="lru", admission="fcfs", tiering="store-all",
    tiering_params={"sync_load_max_s": math.inf})}
