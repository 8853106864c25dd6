"""Translate vLLM's KV cache events into the router's key space.

vLLM 0.32 publishes ``KVEventBatch`` = ``[ts, events, dp_rank]`` (msgpack); each event is
a map tagged by ``type``: ``BlockStored`` (``block_hashes``, ``parent_block_hash``,
``token_ids``, ``block_size``, ``extra_keys``: per block, the cache_salt string among
others, on the first block of a request), ``BlockRemoved`` (``block_hashes``),
``AllBlocksCleared``.

vLLM's block hashes are seeded per process, so the router cannot compute them; it keeps,
per replica, ``vllm_hash -> router key`` and derives each stored block's router key from
its parent's key and its token ids exactly as ``keys.token_block_keys`` does for a
token-id prompt salted with the tenant's ``cache_salt``:

    key(block) = next_key(key(parent) if parent else root_key(cache_salt), tokens(block))

A stored block whose parent is unknown (stored before the router subscribed, or its
mapping evicted) cannot be placed in the chain and is skipped with its descendants in
the event. The map is bounded by the replica's own removals (``BlockRemoved`` drops
entries; ``AllBlocksCleared`` empties it). Prompts the router keys by characters (text
prompts) never match these token keys: precise routing needs token-id prompts.

``medium`` (vLLM's field: ``"GPU"`` or absent for the engine's block pool, ``"CPU"`` for
its offloading connector's host tier, which publishes on the same stream) is carried onto
the translated events, and each medium keeps its own map: a host copy's removal does not
forget the device block of the same hash, and a host block's parent may be a device block.
"""

from __future__ import annotations

from typing import Any, Hashable

from anchorage.routing.events import GPU, AllBlocksCleared, BlockRemoved, BlockStored
from anchorage.routing.keys import next_key, root_key, token_chunk


def _salt_of(extra: Any) -> str | None:
    if isinstance(extra, (list, tuple)):
        for x in extra:
            if isinstance(x, str):
                return x
    return None


def _h(x: Any) -> Hashable:
    return bytes(x) if isinstance(x, (bytearray, memoryview)) else x


class VLLMEventTranslator:
    def __init__(self) -> None:
        self._maps: dict[tuple[int, str], dict[Hashable, int]] = {}
        self.skipped_blocks = 0

    def _parent_key(self, replica: int, medium: str, parent: Hashable) -> int | None:
        own = self._maps.get((replica, medium), {})
        if parent in own:
            return own[parent]
        for (r, _), m in self._maps.items():       # a host block's parent on the device
            if r == replica and parent in m:
                return m[parent]
        return None

    def translate(self, replica: int, event: dict[str, Any]) -> list:
        kind = event.get("type")
        medium = event.get("medium") or GPU
        m = self._maps.setdefault((replica, medium), {})
        if kind == "BlockStored":
            hashes = [_h(x) for x in event.get("block_hashes") or ()]
            tokens = event.get("token_ids") or []
            bs = int(event.get("block_size") or 0)
            if not hashes or bs <= 0 or len(tokens) < bs * len(hashes):
                return []
            parent = _h(event.get("parent_block_hash"))
            extra = event.get("extra_keys") or []
            if parent is None:
                prev = root_key(_salt_of(extra[0] if extra else None))
            else:
                prev = self._parent_key(replica, medium, parent)
                if prev is None:
                    self.skipped_blocks += len(hashes)
                    return []
            keys = []
            for i, h in enumerate(hashes):
                prev = next_key(prev, token_chunk(tokens[i * bs:(i + 1) * bs]))
                m[h] = prev
                keys.append(prev)
            return [BlockStored(keys, medium=medium)]
        if kind == "BlockRemoved":
            keys = [m.pop(_h(x)) for x in event.get("block_hashes") or () if _h(x) in m]
            return [BlockRemoved(keys, medium=medium)] if keys else []
        if kind == "AllBlocksCleared":
            for (r, _), mm in self._maps.items():
                if r == replica:
                    mm.clear()
            return [AllBlocksCleared()]
        return []

    def forget(self, replica: int) -> None:
        for k in [k for k in self._maps if k[0] == replica]:
            del self._maps[k]


def decode_batch(payload: bytes) -> list[dict[str, Any]]:
    """Events of one msgpack ``KVEventBatch``; raises ValueError on a malformed payload."""
    import msgpack

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types
        raise ValueError(f"undecodable KV event batch: {exc}") from None
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], list):
        raise ValueError("KV event batch is not [ts, events, ...]")
    return [e for e in batch[1] if isinstance(e, dict)]
