"""Controls: every peer without the prefill cap.

Every stack of the table caps one prompt's prefill at 2,048 tokens per step while other
requests run or wait (``long_prefill_tokens``: vLLM's ``long_prefill_token_threshold``, off
by default in vLLM; ``spec.PREFILL_CAP``): a vLLM setting any peer can turn on, so the peer
rows have it, as Anchorage's does (issue 40). ``<peer>-no-prefill-cap`` (role ``ablation``:
never counted as the best peer) is a peer row with vLLM's default instead, none: they say
what the setting is worth to each peer (docs/research/fleet.md, "Long prefills").
"""

from dataclasses import replace

from anchorage.fleet.stacks.continuum import STACKS as CONTINUUM
from anchorage.fleet.stacks.dynamo import STACKS as DYNAMO
from anchorage.fleet.stacks.llm_d import STACKS as LLM_D
from anchorage.fleet.stacks.production_stack import STACKS as PRODUCTION_STACK
from anchorage.fleet.stacks.smg import STACKS as SMG
from anchorage.fleet.stacks.stock import STACKS as STOCK

PEERS = {**STOCK, **SMG, **LLM_D, **DYNAMO, **PRODUCTION_STACK, **CONTINUUM}
STACKS = {
    f"{name}-no-prefill-cap": replace(spec, name=f"{name}-no-prefill-cap", role="ablation",
                                      peer=f"{spec.peer}, no prefill cap (vLLM's default)",
                                      long_prefill_tokens=0)
    for name, spec in PEERS.items() if spec.role == "peer" or name == "production-stack-sync"
}
