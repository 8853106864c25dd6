"""``dynamo`` (KV router + KVBM host offload) and ``dynamo+thunderagent``.

Sources: ai-dynamo/dynamo ``lib/kv-router/src/scheduling/selector/default.rs``
(``DefaultWorkerScorer::worker_logit``) with the defaults of
``lib/kv-router/src/scheduling/config.rs`` (``overlap_score_credit`` 1.0,
``prefill_load_scale`` 1.0, ``default_host_cache_hit_weight`` 0.75, temperature 0; router
``dynamo_kv``), ``docs/router/kv_cache_routing.md``; KVBM (the block manager's host pool,
G2): every block stored to host memory, LRU, loaded on a prefix hit (tiering
``store-all``); its workers onboard blocks asynchronously (``sync_load_max_s`` 0, as vLLM's
offloading connector: the request is prefilled in a later step). What the router sees of
the host tier (``docs/components/router/router-offloading.md``, "Offloading Support
Matrix"), two documented ways:

- KVBM (the row, ``dynamo``): "offloaded blocks stay in the router's index as a merged
  device-tier view: a block evicted from GPU but held in KVBM CPU or disk still earns
  routing credit. Per-tier weights do not apply" (KVBM's event consolidator,
  ``lib/llm/src/block_manager/kv_consolidator``, removes a block only when no tier holds
  it): a host-held continuation of the prefix is credited as the device's,
  ``host_cache_hit_weight`` 1.0;
- vLLM's ``OffloadingConnector`` with self-describing events (``dynamo-offloading``, role
  ``ablation``): tier-aware, a host-held continuation credited at
  ``--router-host-cache-hit-weight``, default 0.75 (``config.rs``
  ``default_host_cache_hit_weight``).

Both read the simulator's CPU-medium events (``TieredPrefixIndex``).
ThunderAgent (HaoKang-Timmy/ThunderAgent ``ThunderAgent/scheduler/router.py``,
``backend/state.py``; program gate ``thunderagent``): a program-aware proxy in front of
the workers that pauses programs in tool calls when a worker's KV capacity is exceeded and
resumes them when it has room, placing programs itself (it replaces the KV router's
choice), with KVBM below. Both rows: prefill chunks capped at 2,048 tokens (vLLM's
``long_prefill_token_threshold`` on Dynamo's vLLM workers, ``spec.PREFILL_CAP``).
"""

from anchorage.fleet.spec import PREFILL_CAP, StackSpec

SRC = ("dynamo lib/kv-router/src/scheduling/selector/default.rs worker_logit, config.rs "
       "defaults (credit 1, prefill_load_scale 1, host_cache_hit_weight 0.75, temperature 0); "
       "docs/router/kv_cache_routing.md; KVBM host pool (G1+G2 events)")

ASYNC = {"sync_load_max_s": 0.0}

ROUTER = {"prefill_load_scale": 1.0, "overlap_score_credit": 1.0, "temperature": 0.0,
          "block_size": "$block_size"}

STACKS = {
    "dynamo": StackSpec(
        name="dynamo", peer="Dynamo KV router + KVBM (merged GPU+host index)",
        source=SRC + "; docs/components/router/router-offloading.md (KVBM: merged view)",
        router="dynamo_kv", router_params={**ROUTER, "host_cache_hit_weight": 1.0},
        policy="lru", admission="fcfs", tiering="store-all", tiering_params=dict(ASYNC),
        long_prefill_tokens=PREFILL_CAP),
    "dynamo-offloading": StackSpec(
        name="dynamo-offloading", role="ablation",
        peer="Dynamo KV router (host credit 0.75) + vLLM OffloadingConnector",
        source=SRC + "; docs/components/router/router-offloading.md (vLLM OffloadingConnector, "
                     "self-describing events: tier-aware)",
        router="dynamo_kv", router_params={**ROUTER, "host_cache_hit_weight": 0.75},
        policy="lru", admission="fcfs", tiering="store-all", tiering_params=dict(ASYNC),
        long_prefill_tokens=PREFILL_CAP),
    "dynamo+thunderagent": StackSpec(
        name="dynamo+thunderagent", peer="ThunderAgent + Dynamo KVBM",
        source="ThunderAgent scheduler/router.py MultiBackendRouter, backend/state.py "
               "(interval 5 s, acting weight 1, 100-token buffer); " + SRC,
        program_gate="thunderagent", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params=dict(ASYNC), long_prefill_tokens=PREFILL_CAP),
}
