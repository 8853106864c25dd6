"""``precise_prefix``: the ``prefix`` policy over the replicas' real KV cache events.

Spec: identical decisions to ``prefix`` (balance check, best match above
``cache_threshold``, else most room), but the index is fed only by ``on_kv_event``:
``BlockStored(keys)`` adds the keys to that replica, ``BlockRemoved(keys)`` removes them,
``AllBlocksCleared`` empties the replica. Nothing is inserted on routing, so the index
is the engines' truth up to event delay (vLLM publishes a batch per engine step).
Requests routed before their events arrive are not yet visible, which is why ``prefix``
(the model) is still useful for bursts; llm-d's precise scorer makes the same trade.

Parameters: as ``prefix`` (``capacity_blocks`` only orders step 3).
"""

from __future__ import annotations

from typing import Any

from anchorage.routing.prefix import PrefixRouter


class PrecisePrefixRouter(PrefixRouter):
    name = "precise_prefix"
    model_inserts = False

    def on_kv_event(self, replica: int, event: Any) -> None:
        self.index.apply_event(replica, event)


ROUTERS = {"precise_prefix": lambda **params: PrecisePrefixRouter(**params)}
