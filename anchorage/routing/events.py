"""KV cache events a replica reports, in the router's key space.

They mirror vLLM's ``KVEventBatch`` entries (``vllm/distributed/kv_events.py``):
``BlockStored`` when blocks become cached, ``BlockRemoved`` when their hashes are dropped
(evicted), ``AllBlocksCleared`` on ``reset_prefix_cache``. The simulator emits them from
its block pool with trace keys; the Ray app translates vLLM's msgpack events into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence


@dataclass(frozen=True, slots=True)
class BlockStored:
    keys: Sequence[Hashable]      # in chain order
    parent: Hashable | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    keys: Sequence[Hashable]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
