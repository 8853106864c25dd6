"""``smg``: the SGLang model gateway's ``cache_aware`` policy over stock vLLM engines.

Source: sgl-project/sglang ``sgl-model-gateway/src/policies/cache_aware.rs`` (the
``prefix`` router follows it) with the gateway's defaults (``CliArgs::default``:
``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
``max_tree_size`` 2^26). The gateway's load is its own count of requests in flight per
worker (``tokens_per_request`` 0: request counts only); its approximate tree is bounded by
``max_tree_size`` characters (~2^24 tokens), not by the worker's KV memory, so the model
keeps prefixes the engine has already evicted (``capacity_from_view`` False). Engines:
stock vLLM (LRU, FCFS), prefill chunks capped at 2,048 tokens (``spec.PREFILL_CAP``, vLLM's
``long_prefill_token_threshold``; ``smg-no-prefill-cap``: without).
"""

from anchorage.fleet.spec import PREFILL_CAP, StackSpec

SMG_ROUTER = {"cache_threshold": 0.3, "balance_abs_threshold": 64,
              "balance_rel_threshold": 1.5, "tokens_per_request": 0,
              "capacity_blocks": 1 << 18, "capacity_from_view": False}

STACKS = {"smg": StackSpec(
    name="smg", peer="SGLang model gateway (cache_aware) + vLLM",
    source="sglang sgl-model-gateway src/policies/cache_aware.rs; CliArgs defaults "
           "(0.3 / 64 / 1.5, max_tree_size 2^26)",
    router="prefix", router_params=dict(SMG_ROUTER), policy="lru", admission="fcfs",
    long_prefill_tokens=PREFILL_CAP)}
