"""The engine's KV cache events, for the sidecar: which anchors are cached, warm-up outcomes.

vLLM 0.32 publishes ``KVEventBatch`` = msgpack ``[ts, events, dp_rank]`` on a ZMQ PUB
socket (frames: topic, sequence number, payload); events are maps tagged by ``type``:
``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
...), ``BlockRemoved`` (``block_hashes``), ``AllBlocksCleared``.

vLLM's block hashes are seeded per process, so the sidecar names blocks by token-chain keys
(``anchorage.routing.keys.token_block_keys``: the same key for the same token prefix, in
any process), translated from each stored block's parent and token ids exactly as the
router does (``anchorage.routing.vllm_events.VLLMEventTranslator``, which also reads the
``cache_salt`` vLLM publishes with a chain's first block). An anchor (token ids and cache
salt from the plugin's registry) is cached iff its last key is.

``CacheTracker`` is pure (events in, state out); ``KVEventSubscriber`` is the ZMQ adapter
(a daemon thread; connect it before the engine publishes: PUB drops what no SUB hears).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from typing import Any, Hashable, Sequence

from anchorage.routing.events import AllBlocksCleared, BlockRemoved, BlockStored
from anchorage.routing.keys import token_block_keys
from anchorage.routing.vllm_events import VLLMEventTranslator

log = logging.getLogger("anchorage.node_agent.kv_events")


def anchor_key(token_ids: Sequence[int], block_size: int,
               cache_salt: str | None = None) -> int | None:
    """The key of an anchor's last full block under ``cache_salt`` (None when shorter
    than a block): a salted prefix is another chain (vLLM salts its first block)."""
    keys = token_block_keys(token_ids, block_size, cache_salt) if block_size > 0 else []
    return keys[-1] if keys else None


class CacheTracker:
    """Cached block keys of one engine, from its events.

    Also counts *premature evictions*: a block stored again within ``horizon_s`` of its
    removal was requested again after it was evicted (``reused_after_eviction``)."""

    def __init__(self, horizon_s: float = 600.0, max_removed: int = 1 << 16):
        self._tr = VLLMEventTranslator()
        self.cached: set[Hashable] = set()
        self.removed_at: OrderedDict[Hashable, float] = OrderedDict()
        self.cleared_at = -math.inf
        self.horizon_s = horizon_s
        self.max_removed = max_removed
        self.batches = self.stored_blocks = self.removed_blocks = 0
        self.reused_after_eviction = 0
        self.last_ts = -math.inf

    def apply(self, ts: float, events: list[dict[str, Any]]) -> None:
        self.batches += 1
        self.last_ts = max(self.last_ts, ts)
        for ev in events:
            for out in self._tr.translate(0, ev):
                if isinstance(out, BlockStored):
                    for k in out.keys:
                        self.stored_blocks += 1
                        t = self.removed_at.pop(k, None)
                        if t is not None and ts - t <= self.horizon_s:
                            self.reused_after_eviction += 1
                        self.cached.add(k)
                elif isinstance(out, BlockRemoved):
                    for k in out.keys:
                        self.removed_blocks += 1
                        self.cached.discard(k)
                        self.removed_at[k] = ts
                        self.removed_at.move_to_end(k)
                    while len(self.removed_at) > self.max_removed:
                        self.removed_at.popitem(last=False)
                elif isinstance(out, AllBlocksCleared):
                    self.cached.clear()
                    self.cleared_at = ts

    def is_cached(self, key: Hashable | None) -> bool:
        return key is not None and key in self.cached

    def removed_since(self, key: Hashable, t: float) -> float | None:
        """When ``key`` left the cache at or after ``t`` (None if it did not)."""
        r = self.removed_at.get(key)
        if r is not None and r >= t and key not in self.cached:
            return r
        if self.cleared_at >= t:
            return self.cleared_at
        return None


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]]]:
    """``(ts, events)`` of one msgpack ``KVEventBatch``; ValueError when malformed."""
    import msgpack

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types
        raise ValueError(f"undecodable KV event batch: {exc}") from None
    if (not isinstance(batch, (list, tuple)) or len(batch) < 2
            or not isinstance(batch[0], (int, float)) or not isinstance(batch[1], list)):
        raise ValueError("KV event batch is not [ts, events, ...]")
    return float(batch[0]), [e for e in batch[1] if isinstance(e, dict)]


class KVEventSubscriber:
    """ZMQ SUB on the engine's endpoint feeding a ``CacheTracker`` (under ``lock``)."""

    def __init__(self, endpoint: str, tracker: CacheTracker, topic: str = "kv"):
        self.endpoint = endpoint
        self.tracker = tracker
        self.topic = topic.encode()
        self.lock = threading.Lock()
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock = None

    def start(self) -> "KVEventSubscriber":
        import zmq

        self._ctx = zmq.Context()
        s = self._ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, self.topic)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)  # before the engine publishes; ZMQ reconnects by itself
        self._sock = s
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()
        return self

    def _run(self) -> None:
        import zmq

        s = self._sock
        try:
            while not self._stop.is_set():
                if not s.poll(100, zmq.POLLIN):
                    continue
                parts = s.recv_multipart()
                try:
                    ts, events = decode_batch(parts[-1])
                except ValueError as exc:
                    self.errors += 1
                    log.warning("dropping a KV event batch: %s", exc)
                    continue
                with self.lock:
                    self.tracker.apply(ts, events)
        finally:
            s.close(linger=0)
            self._ctx.term()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
