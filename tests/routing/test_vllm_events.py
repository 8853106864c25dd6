import msgpack
import pytest

from anchorage.routing import make_router
from anchorage.routing.events import AllBlocksCleared, BlockRemoved, BlockStored
from anchorage.routing.keys import token_block_keys
from anchorage.routing.vllm_events import VLLMEventTranslator, decode_batch
from tests.routing.helpers import ctx, views

BS = 4
PROMPT = list(range(100, 116))          # four blocks


def stored(hashes, parent, tokens, salt=None):
    extra = [[salt] if salt else None] + [None] * (len(hashes) - 1)
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BS, "lora_id": None, "medium": "GPU",
            "extra_keys": extra}


def test_stored_blocks_get_the_keys_the_router_computes_for_the_prompt():
    tr = VLLMEventTranslator()
    a = tr.translate(0, stored([b"h1", b"h2"], None, PROMPT[:8], salt="s"))
    b = tr.translate(0, stored([b"h3", b"h4"], b"h2", PROMPT[8:], salt=None))
    assert a[0].keys + b[0].keys == token_block_keys(PROMPT, BS, salt="s")
    assert token_block_keys(PROMPT, BS, salt="other")[0] not in a[0].keys


def test_removed_cleared_and_unknown_parents():
    tr = VLLMEventTranslator()
    k = tr.translate(1, stored([7, 8], None, PROMPT[:8]))[0].keys
    assert tr.translate(1, {"type": "BlockRemoved", "block_hashes": [8, 99]}) == [BlockRemoved([k[1]])]
    assert tr.translate(1, stored([9], 8, PROMPT[8:12])) == []      # parent gone: skipped
    assert tr.skipped_blocks == 1
    assert tr.translate(1, {"type": "AllBlocksCleared"}) == [AllBlocksCleared()]
    assert tr.translate(1, stored([10], 7, PROMPT[4:8])) == []      # map cleared too


def test_precise_prefix_routes_on_translated_events():
    tr = VLLMEventTranslator()
    r = make_router("precise_prefix")
    for ev in tr.translate(2, stored([1, 2, 3], None, PROMPT[:12])):
        r.on_kv_event(2, ev)
    c = ctx(token_block_keys(PROMPT, BS))
    assert r.pick(c, views(3)) == 2 and r.predicted_hit_blocks(c, 2) == 3


def test_decode_batch_and_malformed_payloads():
    payload = msgpack.packb([1.5, [stored([1], None, PROMPT[:4]), "junk"], None])
    assert decode_batch(payload)[0]["type"] == "BlockStored" and len(decode_batch(payload)) == 1
    for bad in (b"\xc1", msgpack.packb({"ts": 1})):
        with pytest.raises(ValueError, match="KV event batch"):
            decode_batch(bad)
    assert isinstance(BlockStored([1]), BlockStored)


def test_host_tier_events_keep_their_medium_and_do_not_forget_the_device_block():
    from anchorage.routing.events import CPU, GPU
    from anchorage.routing.prefix_index import PrefixIndex
    t = VLLMEventTranslator()
    toks = list(range(32))
    gpu = {"type": "BlockStored", "block_hashes": [b"a", b"b"], "parent_block_hash": None,
           "token_ids": toks, "block_size": 16}
    (dev,) = t.translate(0, gpu)
    (host,) = t.translate(0, dict(gpu, medium="CPU"))
    assert dev.medium == GPU and host.medium == CPU and list(host.keys) == list(dev.keys)
    (gone,) = t.translate(0, {"type": "BlockRemoved", "block_hashes": [b"a", b"b"],
                              "medium": "CPU"})
    assert gone.medium == CPU
    idx = PrefixIndex(None)
    for ev in (dev, host, gone):
        idx.apply_event(0, ev)              # a device index ignores the host's events
    assert idx.match_len(0, list(dev.keys)) == 2
    # the device block is still known: its child on the device is placed in the chain
    child = {"type": "BlockStored", "block_hashes": [b"c"], "parent_block_hash": b"b",
             "token_ids": list(range(32, 48)), "block_size": 16}
    assert t.translate(0, child)
