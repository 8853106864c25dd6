"""``dynamo`` (KV router + KVBM host offload) and ``dynamo+thunderagent``.

Sources: ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs`` (``DefaultWorkerSelector``,
``softmax_sample``; router ``dynamo_kv``, ``overlap_score_weight`` 1, temperature 0),
``docs/router/kv_cache_routing.md``; KVBM (the block manager's host pool, G2): every
block stored to host memory, LRU, loaded on a prefix hit (tiering ``store-all``); its
workers onboard blocks asynchronously (``sync_load_max_s`` 0, as vLLM's offloading
connector: the request is prefilled in a later step).
ThunderAgent (HaoKang-Timmy/ThunderAgent ``ThunderAgent/scheduler/router.py``,
``backend/state.py``; program gate ``thunderagent``): a program-aware proxy in front of
the workers that pauses programs in tool calls when a worker's KV capacity is exceeded and
resumes them when it has room, placing programs itself (it replaces the KV router's
choice), with KVBM below.
"""

from anchorage.fleet.spec import StackSpec

SRC = ("dynamo lib/llm/src/kv_router/scheduler.rs DefaultWorkerSelector (weight 1, "
       "temperature 0); docs/router/kv_cache_routing.md; KVBM host pool")

ASYNC = {"sync_load_max_s": 0.0}

STACKS = {
    "dynamo": StackSpec(
        name="dynamo", peer="Dynamo KV router + KVBM", source=SRC, router="dynamo_kv",
        router_params={"overlap_score_weight": 1.0, "temperature": 0.0,
                       "block_size": "$block_size"},
        policy="lru", admission="fcfs", tiering="store-all", tiering_params=ASYNC),
    "dynamo+thunderagent": StackSpec(
        name="dynamo+thunderagent", peer="ThunderAgent + Dynamo KVBM",
        source="ThunderAgent scheduler/router.py MultiBackendRouter, backend/state.py "
               "(interval 5 s, acting weight 1, 100-token buffer); " + SRC,
        program_gate="thunderagent", policy="lru", admission="fcfs", tiering="store-all",
        tiering_params=ASYNC),
}
