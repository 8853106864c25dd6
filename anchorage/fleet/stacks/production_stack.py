"""``production-stack`` and ``production-stack-sync``: the vLLM production stack: session
routing, LMCache offloading every request's KV to host memory.

Sources: vllm-project/production-stack ``src/vllm_router/routers/routing_logic.py``
(``SessionRouter``: a consistent-hash ring on the session id, no load bound, lowest QPS
without one; router ``session_affinity``); LMCache's local CPU backend: every request's KV
chunks are stored to host memory as they are computed (incremental, LRU) and retrieved on a
prefix hit at scheduling (tiering ``store-all``); the GPU cache stays vLLM's LRU. vLLM 0.32
ships two LMCache connectors, two documented modes:

- ``LMCacheMPConnector`` (``kv_connector/v1/lmcache_mp_connector.py``,
  ``get_num_new_matched_tokens`` returns ``need_to_load > 0`` as ``load_async``): the hit is
  loaded between steps and the request prefilled in a later step, as vLLM's offloading
  connector does (``sync_load_max_s`` 0): the row, ``production-stack``;
- ``LMCacheConnectorV1`` (``lmcache_connector.py``: ``load_async`` False): the hit is loaded
  before the forward pass of the step that schedules the request (``sync_load_max_s`` inf):
  ``production-stack-sync`` (role ``ablation``: the other mode, kept as a variant).

Which one is the row is decided by the measurement (issue 40: a peer with two documented
modes gets its better one): async, which measured at or above sync on SWE-agent
(docs/research/fleet.md). Both: prefill chunks capped at 2,048 tokens (``spec.PREFILL_CAP``).
"""

import math

from anchorage.fleet.spec import PREFILL_CAP, StackSpec

SRC = ("production-stack routing_logic.py SessionRouter (HashRing, lowest QPS); LMCache local "
       "CPU backend (store every chunk, LRU)")

STACKS = {
    "production-stack": StackSpec(
        name="production-stack", peer="vLLM production-stack + LMCache (async connector)",
        source=SRC + "; vLLM LMCacheMPConnector (load_async)",
        router="session_affinity", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params={"sync_load_max_s": 0.0}, long_prefill_tokens=PREFILL_CAP),
    "production-stack-sync": StackSpec(
        name="production-stack-sync", peer="vLLM production-stack + LMCache (sync connector)",
        role="ablation", source=SRC + "; vLLM LMCacheConnectorV1 (load_async False)",
        router="session_affinity", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params={"sync_load_max_s": math.inf}, long_prefill_tokens=PREFILL_CAP),
}
