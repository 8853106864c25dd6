"""Controls: the strongest peers with Anchorage's engine prefill cap.

Anchorage's stack caps one prompt's prefill at 2,048 tokens per step while other requests
run or wait (``long_prefill_tokens``: vLLM's ``long_prefill_token_threshold``, off by
default in vLLM; the peer stacks here run vLLM's defaults). The cap is a vLLM setting any
peer could turn on, so each of these rows is a peer stack exactly as shipped plus that one
setting (``<peer>+prefill-cap``, role ``ablation``: never counted as the best peer). They
say how much of Anchorage's lead is the setting and how much is Anchorage's own
(docs/research/fleet.md, "Long prefills").
"""

from dataclasses import replace

from anchorage.fleet.stacks.anchorage_stack import FULL
from anchorage.fleet.stacks.dynamo import STACKS as DYNAMO
from anchorage.fleet.stacks.llm_d import STACKS as LLM_D
from anchorage.fleet.stacks.production_stack import STACKS as PRODUCTION_STACK

PEERS = {**DYNAMO, **LLM_D, **PRODUCTION_STACK}
STACKS = {
    f"{name}+prefill-cap": replace(PEERS[name], name=f"{name}+prefill-cap", role="ablation",
                                   peer=f"{PEERS[name].peer}, prefill chunks capped "
                                        f"(vLLM long_prefill_token_threshold "
                                        f"{FULL.long_prefill_tokens})",
                                   long_prefill_tokens=FULL.long_prefill_tokens)
    for name in ("dynamo+thunderagent", "llm-d+offload", "production-stack")
}
