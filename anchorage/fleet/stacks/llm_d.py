"""``llm-d``, ``llm-d+offload`` and ``llm-d-tiered``: llm-d's inference scheduler over vLLM,
with its precise prefix-cache-aware profile, optionally vLLM's CPU offloading connector, and
the router of its tiered-prefix-cache guide.

Sources:
- llm-d/llm-d ``guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml``
  (profile ``default``: precise-prefix-cache-scorer 2.0, kv-cache-utilization-scorer 1.0,
  queue-scorer 1.0, max-score-picker; router ``llm_d``). The precise scorer's index holds
  every medium the engines publish: vLLM 0.32's offloading connector publishes its CPU
  tier's ``BlockStored``/``BlockRemoved`` with ``medium`` CPU
  (``kv_connector/v1/offloading/events.py``), llm-d-kv-cache's event pool keeps each block's
  ``DeviceTier`` (``pkg/kvevents/pool.go``) and its scorer credits a CPU block 0.8, a GPU
  block 1.0 (``pkg/kvcache/backend.go`` ``DefaultKVCacheBackendConfig``), over the request's
  blocks (llm-d-inference-scheduler ``preciseprefixcache/utils.go`` ``absoluteScoredPods``,
  main since #1107, 2026-05-14). The release before it, v0.8.0, normalised min-max across
  the pods with a match (``indexedScoresToNormalizedScoredPods``): two shipped versions, and
  the row is the better one (issue 40); ``llm-d+offload-min-max`` (role ``ablation``) is
  v0.8.0's, which measured below it on WEKA (0.1712 against 0.1886 turns/s per GPU at 8
  sessions per GPU, seed 1; p90 TTFT 2.33 against 0.96 s). Without offload only GPU events
  exist.
- the tiered-prefix-cache guide (``guides/tiered-prefix-cache/cpu``): the model server with
  vLLM's ``OffloadingConnector`` (``cpu_bytes_to_use``): every computed block stored in host
  memory (incremental, LRU), a prefix hit loaded from it when a request is scheduled (tiering
  ``store-all``), always asynchronously (the request is prefilled in a later step:
  ``sync_load_max_s`` 0); the GPU order stays vLLM's LRU. ``llm-d+offload`` puts the precise
  profile in front of it; ``llm-d-tiered`` the guide's own router
  (``router/tiered-prefix-cache-cpu.values.yaml``: queue-scorer 2, kv-cache-utilization 2,
  gpu-prefix-cache-scorer 1, cpu-prefix-cache-scorer 1 with ``lruCapacityPerServer`` the CPU
  cache's blocks; a ``composite`` router, ``anchorage.routing.llm_d.tiered_guide_params``,
  its CPU LRU the replica's host tier, ``"$host_blocks"``).
- every row: prefill chunks capped at 2,048 tokens per step (vLLM's
  ``long_prefill_token_threshold``, ``spec.PREFILL_CAP``); ``-no-prefill-cap`` variants in
  ``controls``.
"""

from anchorage.fleet.spec import PREFILL_CAP, StackSpec
from anchorage.routing.llm_d import tiered_guide_params

SRC = ("llm-d guides/precise-prefix-cache-aware scheduler values (2/1/1, max-score); "
       "llm-d-inference-scheduler preciseprefixcache utils.go absoluteScoredPods (#1107); "
       "llm-d-kv-cache backend.go (GPU 1.0, CPU 0.8)")
OFFLOAD = ("guides/tiered-prefix-cache/cpu offloading-connector (vLLM OffloadingConnector, "
           "cpu_bytes_to_use; CPU-medium KV events)")
ASYNC = {"sync_load_max_s": 0.0}

STACKS = {
    "llm-d": StackSpec(name="llm-d", peer="llm-d (precise prefix) + vLLM", source=SRC,
                       router="llm_d", policy="lru", admission="fcfs",
                       long_prefill_tokens=PREFILL_CAP),
    "llm-d+offload": StackSpec(
        name="llm-d+offload", peer="llm-d (precise prefix, GPU+CPU index) + vLLM CPU offload",
        source=SRC + "; " + OFFLOAD,
        router="llm_d", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params=dict(ASYNC), long_prefill_tokens=PREFILL_CAP),
    "llm-d-tiered": StackSpec(
        name="llm-d-tiered", peer="llm-d tiered-prefix-cache guide (GPU+CPU prefix scorers) "
                                  "+ vLLM CPU offload",
        source="llm-d guides/tiered-prefix-cache/cpu/router/tiered-prefix-cache-cpu.values.yaml "
               "(queue 2, kv-util 2, gpu-prefix 1, cpu-prefix 1, lruCapacityPerServer); "
               + OFFLOAD,
        router="composite", router_params=tiered_guide_params("$host_blocks"),
        policy="lru", admission="fcfs", tiering="store-all", tiering_params=dict(ASYNC),
        long_prefill_tokens=PREFILL_CAP),
}
STACKS["llm-d+offload-min-max"] = StackSpec(
    name="llm-d+offload-min-max", role="ablation",
    peer="llm-d v0.8.0 (precise prefix min-max, GPU+CPU index) + vLLM CPU offload",
    source=SRC.replace("absoluteScoredPods (#1107)", "v0.8.0 indexedScoresToNormalizedScoredPods")
    + "; " + OFFLOAD,
    router="llm_d", router_params={"normalization": "min-max"}, policy="lru",
    admission="fcfs", tiering="store-all", tiering_params=dict(ASYNC),
    long_prefill_tokens=PREFILL_CAP)
