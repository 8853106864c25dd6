"""KV cache events a replica reports, in the router's key space.

They mirror vLLM's ``KVEventBatch`` entries (``vllm/distributed/kv_events.py``):
``BlockStored`` when blocks become cached, ``BlockRemoved`` when their hashes are dropped
(evicted), ``AllBlocksCleared`` on ``reset_prefix_cache``. The simulator emits them from
its block pool with trace keys; the Ray app translates vLLM's msgpack events into them.

``medium``: the tier the event is about (vLLM's ``medium`` field: ``"GPU"``, the default,
for the engine's own block pool; ``"CPU"`` for its offloading connector's host tier, which
vLLM 0.32 publishes on the same stream: ``kv_connector/v1/offloading/events.py``,
``MEDIUM_CPU``). A router that indexes only the device (``PrefixIndex.apply_event``)
ignores the other media; a tier-aware one (``TieredPrefixIndex``) keeps them apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

GPU = "GPU"   # vllm.distributed.kv_events MEDIUM_GPU
CPU = "CPU"   # vllm.distributed.kv_events MEDIUM_CPU


@dataclass(frozen=True, slots=True)
class BlockStored:
    keys: Sequence[Hashable]      # in chain order
    parent: Hashable | None = None
    medium: str = GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    keys: Sequence[Hashable]
    medium: str = GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
