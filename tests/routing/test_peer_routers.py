"""The peer routers' decision rules: Dynamo's KV router cost, llm-d's scheduling profile,
the production stack's session ring."""

import math

import pytest

from anchorage.routing import make_router
from anchorage.routing.dynamo_kv import dynamo_logit, softmax_probabilities
from anchorage.routing.events import BlockRemoved, BlockStored
from anchorage.routing.llm_d import llm_d_router
from tests.routing.helpers import ctx, views


def test_dynamo_logit_is_weighted_prefill_blocks_plus_decode_blocks():
    # 1,000 prompt tokens, 40 of 63 blocks cached (16-token blocks), 320 prefill tokens
    # in flight, 100 active blocks, 23 new: 1.0 * (320 + 1000 - 640) / 16 + 100 + 23
    assert dynamo_logit(1000, 40, 16, 320, 100, 23) == pytest.approx(680 / 16 + 123)
    assert dynamo_logit(1000, 63, 16, 0, 0, 0) == 0.0  # hit beyond the prompt: max(., 0)
    assert dynamo_logit(160, 0, 16, 0, 0, 0, overlap_score_weight=2.0) == 20.0


def test_dynamo_routes_to_the_cached_worker_until_its_load_outweighs_the_prefill():
    r = make_router("dynamo_kv", block_size=16)
    keys = list(range(20))
    r.on_kv_event(1, BlockStored(keys=keys))
    c = ctx(keys + [99])                   # 21 blocks, 20 cached on worker 1
    assert r.pick(c, views(3)) == 1
    # worker 1 busy: 40 active blocks and 512 prefill tokens of another request
    busy = ctx(list(range(100, 140)))
    busy.input_length = 512
    r.on_start(busy, 1)
    # worker 1: (512 + 337 - 320) / 16 + 40 + 21 = 94.06; worker 0: 337 / 16 + 21 = 42.06
    assert r.pick(c, views(3)) == 0
    r.on_first_token(busy, 1)              # its prefill is done: 33.06 + 61 = 94.06 - 32
    assert r.logits(c, views(3), [0, 1])[1] == pytest.approx(17 / 16 + 40 + 21)
    r.on_finish(busy, 1)
    assert r.pick(c, views(3)) == 1
    r.on_kv_event(1, BlockRemoved(keys=keys[5:]))
    assert r.index.match_len(1, c.keys) == 5


def test_dynamo_ties_go_to_the_smaller_tree_and_temperature_samples():
    r = make_router("dynamo_kv", block_size=16)
    r.on_kv_event(0, BlockStored(keys=[7, 8, 9]))  # worker 0 holds other blocks
    assert r.pick(ctx([1, 2]), views(2)) == 1
    p = softmax_probabilities([10.0, 20.0], temperature=1.0)
    assert p[0] == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert softmax_probabilities([5.0, 5.0, 5.0], 0.5) == [1 / 3] * 3
    rs = make_router("dynamo_kv", block_size=16, temperature=2.0, seed=3)
    picks = {rs.pick(ctx([1, 2]), views(2)) for _ in range(50)}
    assert picks == {0, 1}


def test_llm_d_profile_weights_prefix_kv_and_waiting_queue():
    r = llm_d_router()
    assert [w for w, _ in r.scorers] == [2.0, 1.0, 1.0]
    r.on_kv_event(0, BlockStored(keys=[1, 2, 3, 4]))
    v = views(3, kv=[0.9, 0.0, 0.0])
    v[0].waiting, v[1].waiting, v[2].waiting = 4, 0, 2
    c = ctx([1, 2, 3, 4])
    # totals: r0 = 2*1 + 0.1 + 0 = 2.1; r1 = 0 + 1 + 1 = 2.0; r2 = 0 + 1 + 0.5 = 1.5
    assert r.pick(c, v) == 0
    v[0].kv_usage = 1.0                    # r0 = 2.0 ties r1: a random tie-break
    assert r.pick(c, v) in (0, 1)
    v[0].waiting = 8                       # min-max over waiting queues, r0 scores 0
    assert r.pick(c, v) in (0, 1)


def test_session_affinity_sticks_whatever_the_load_and_sends_sessionless_to_lowest_qps():
    r = make_router("session_affinity")
    c = ctx([1], session="s1")
    first = r.pick(c, views(4))
    loads = [0, 0, 0, 0]
    loads[first] = 500
    assert r.pick(ctx([2], session="s1"), views(4, loads=loads)) == first
    owners = {r.pick(ctx([1], session=f"s{i}"), views(4)) for i in range(64)}
    assert owners == {0, 1, 2, 3}          # the ring spreads sessions
    for i in range(3):
        r.on_start(ctx([5], now=10.0), 0)
    r.on_start(ctx([5], now=10.0), 1)
    r.on_start(ctx([5], now=10.0), 2)
    assert r.pick(ctx([9], now=11.0), views(4)) == 3
    assert r.pick(ctx([9], now=200.0), views(4)) == 0  # the 60 s window has passed
