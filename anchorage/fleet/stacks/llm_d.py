"""``llm-d`` and ``llm-d+offload``: llm-d's inference scheduler with its precise
prefix-cache-aware profile, over vLLM; optionally vLLM's CPU offloading connector.

Sources: llm-d/llm-d ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``
(profile ``default``: precise-prefix-cache-scorer 2.0, kv-cache-utilization-scorer 1.0,
queue-scorer 1.0, max-score-picker; router ``llm_d``); the tiered-prefix-cache guide
(``guides/tiered-prefix-cache/cpu/modelserver/gpu/vllm/offloading-connector``:
``OffloadingConnector`` with ``cpu_bytes_to_use``): vLLM stores every computed block in
host memory (incremental, LRU) and loads a prefix hit from it when a request is
scheduled (tiering ``store-all``), always asynchronously (the request is prefilled in a
later step: ``sync_load_max_s`` 0); the GPU order stays vLLM's LRU.
"""

from anchorage.fleet.spec import StackSpec

SRC = ("llm-d guides/precise-prefix-cache-aware scheduler values (2/1/1, max-score); "
       "llm-d-inference-scheduler pkg/epp scorers")

STACKS = {
    "llm-d": StackSpec(name="llm-d", peer="llm-d (precise prefix) + vLLM", source=SRC,
                       router="llm_d", policy="lru", admission="fcfs"),
    "llm-d+offload": StackSpec(
        name="llm-d+offload", peer="llm-d + vLLM CPU offload",
        source=SRC + "; guides/tiered-prefix-cache/cpu offloading-connector "
                     "(vLLM OffloadingConnector, cpu_bytes_to_use)",
        router="llm_d", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params={"sync_load_max_s": 0.0}),
}
