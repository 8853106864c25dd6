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


# -- issue 40: the peers' host-tier-aware indexes ---------------------------------------
from anchorage.routing.events import CPU  # noqa: E402
from anchorage.routing.scorers import make_scorer  # noqa: E402


def _tiered_llm_d_index(s):
    s.on_kv_event(0, BlockStored(keys=[1, 2, 3, 4]))               # GPU: all 4
    s.on_kv_event(1, BlockStored(keys=[1, 2]))                     # GPU: 2, then CPU: all 4
    s.on_kv_event(1, BlockStored(keys=[1, 2, 3, 4], medium=CPU))
    s.on_kv_event(2, BlockStored(keys=[1], medium=CPU))            # CPU: 1


def test_llm_d_precise_scorer_credits_cpu_blocks_at_0_8_min_max_or_absolute():
    """llm-d-kv-cache ``pkg/kvcache/backend.go`` (GPU 1.0, CPU 0.8) and ``kvblock_scorer.go``
    (each leading block its best tier's weight), then llm-d-inference-scheduler v0.8.0
    ``preciseprefixcache/utils.go`` ``indexedScoresToNormalizedScoredPods``: (s - min) /
    (max - min) over the pods with a score, 1.0 for all when they are equal, 0 without; or
    main's ``absoluteScoredPods`` (#1107): s / total."""
    s = make_scorer("precise_prefix", normalization="min-max")
    _tiered_llm_d_index(s)
    c = ctx([1, 2, 3, 4])
    # raw: r0 = 4, r1 = 2 + 2 * 0.8 = 3.6, r2 = 0.8, r3 none
    assert s.raw_scores(c.keys) == pytest.approx({0: 4.0, 1: 3.6, 2: 0.8})
    assert s.score(c, views(4), [0, 1, 2, 3]) == pytest.approx([1.0, 0.875, 0.0, 0.0])
    # a sole matching pod scores 1.0 however short its match (min == max)
    assert s.score(ctx([9, 4]), views(4), [0, 1, 2, 3]) == [0.0] * 4   # nobody: all 0
    s.on_kv_event(3, BlockStored(keys=[50]))
    assert s.score(ctx([50, 51, 52, 53]), views(4), [0, 1, 2, 3]) == [0.0, 0.0, 0.0, 1.0]
    # main since #1107 (the default): absoluteScoredPods, raw / total clipped to [0, 1]
    a = make_scorer("precise_prefix")
    assert a.normalization == "absolute"
    _tiered_llm_d_index(a)
    assert a.score(c, views(4), [0, 1, 2, 3]) == pytest.approx([1.0, 0.9, 0.2, 0.0])
    # a CPU removal leaves the GPU copy; the GPU's removal leaves the CPU copy
    s.on_kv_event(1, BlockRemoved(keys=[3, 4], medium=CPU))
    assert s.raw_scores(c.keys)[1] == pytest.approx(2.0)
    s.on_kv_event(0, BlockRemoved(keys=[2, 3, 4]))
    assert s.raw_scores(c.keys)[0] == pytest.approx(1.0)
    s.on_kv_event(2, BlockRemoved(keys=[1]))                       # GPU event: CPU kept
    assert s.raw_scores(c.keys)[2] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="normalization"):
        make_scorer("precise_prefix", normalization="max")
    with pytest.raises(ValueError, match="GPU weight"):
        make_scorer("precise_prefix", medium_weights={"CPU": 1.0})


def test_device_only_indexes_ignore_the_host_tiers_events():
    """smg's tree and the ``precise_prefix`` router index the GPU only: vLLM's CPU-medium
    events must not read as GPU blocks."""
    s = make_scorer("precise_prefix", medium_weights={"GPU": 1.0})
    _tiered_llm_d_index(s)
    assert s.raw_scores([1, 2, 3, 4]) == {0: 4.0, 1: 2.0}
    r = make_router("precise_prefix")
    r.on_kv_event(1, BlockStored(keys=[1, 2, 3], medium=CPU))
    assert r.index.match([1, 2, 3]) == {}


def test_llm_d_offload_profile_prefers_the_host_held_history_over_an_idle_replica():
    """The precise profile with CPU events: a replica holding the prompt in host memory
    only outscores an empty one (2 * 1.0 against 0, the loads equal), which a GPU-only index
    cannot see."""
    r = llm_d_router()
    r.on_kv_event(2, BlockStored(keys=list(range(10)), medium=CPU))
    assert r.pick(ctx(range(10)), views(3)) == 2
    gpu_only = llm_d_router(medium_weights={"GPU": 1.0})
    gpu_only.on_kv_event(2, BlockStored(keys=list(range(10)), medium=CPU))
    assert {gpu_only.pick(ctx(range(10)), views(3)) for _ in range(40)} == {0, 1, 2}


def test_llm_d_tiered_guide_scores_gpu_and_cpu_prefix_lrus_of_their_capacities():
    """llm-d ``guides/tiered-prefix-cache/cpu/router/tiered-prefix-cache-cpu.values.yaml``:
    queue 2, kv-cache-utilization 2, gpu-prefix 1 (approximate, the server's capacity),
    cpu-prefix 1 (approximate, ``lruCapacityPerServer``)."""
    from anchorage.routing.llm_d import llm_d_tiered_router

    r = llm_d_tiered_router(cpu_capacity_blocks=100)
    assert [w for w, _ in r.scorers] == [2.0, 2.0, 1.0, 1.0]
    gpu, cpu = r.scorers[2][1], r.scorers[3][1]
    v = views(2, capacity=4)                 # each replica's GPU holds 4 blocks
    first = ctx([1, 2, 3, 4])
    r.on_start(first, 0)
    r.on_start(ctx([10, 11, 12, 13]), 0)     # pushes the first prompt out of the GPU's LRU
    assert gpu.score(first, v, [0, 1]) == [0.0, 0.0]
    assert cpu.score(first, v, [0, 1]) == [1.0, 0.0]   # still within the CPU's 100
    assert r.pick(first, v) == 0
    with pytest.raises(ValueError, match="cpu_capacity_blocks"):
        llm_d_tiered_router(cpu_capacity_blocks=0)


def test_dynamo_credits_the_host_continuation_at_its_host_cache_hit_weight():
    """Dynamo ``lib/kv-router/src/scheduling/selector/default.rs`` ``worker_logit``:
    ``prefill_load_scale * max(0, raw_prefill_blocks - (credit * device + 0.75 * host)) +
    decode_blocks``, ``config.rs`` ``default_host_cache_hit_weight`` 0.75."""
    # 1,000 tokens, 16-token blocks: 62.5 raw prefill blocks, 20 on the GPU, 20 more in host
    assert dynamo_logit(1000, 20, 16, 0, 0, 0, host_blocks=20) == pytest.approx(62.5 - 35)
    assert dynamo_logit(1000, 20, 16, 0, 0, 0, host_blocks=20,
                        host_cache_hit_weight=0.0) == pytest.approx(62.5 - 20)
    r = make_router("dynamo_kv", block_size=16)
    assert r.host_cache_hit_weight == 0.75 and r.overlap_score_weight == 1.0
    keys = list(range(20))
    r.on_kv_event(0, BlockStored(keys=keys[:10]))                  # worker 0: 10 on GPU
    r.on_kv_event(1, BlockStored(keys=keys[:5]))                   # worker 1: 5 on GPU,
    r.on_kv_event(1, BlockStored(keys=keys, medium=CPU))           # all 20 in host memory
    c = ctx(keys + [99])                                           # 337 tokens, 21 blocks
    lg = r.logits(c, views(2), [0, 1])
    assert lg == pytest.approx([337 / 16 - 10 + 21, 337 / 16 - (5 + 0.75 * 15) + 21])
    assert r.pick(c, views(2)) == 1
    r.on_start(c, 1)                     # its prefill load: 337 - (5 + 0.75 * 15) * 16
    assert r.active[1].prefill_tokens == 337 - 260
    gpu_only = make_router("dynamo_kv", block_size=16, host_cache_hit_weight=0.0)
    for w, k, m in ((0, keys[:10], "GPU"), (1, keys[:5], "GPU"), (1, keys, CPU)):
        gpu_only.on_kv_event(w, BlockStored(keys=k, medium=m))
    assert gpu_only.pick(c, views(2)) == 0
    with pytest.raises(ValueError, match="host_cache_hit_weight"):
        make_router("dynamo_kv", host_cache_hit_weight=1.5)
    # the deprecated overlap_score_weight is the prefill load scale (0 also zeroes the credit)
    assert make_router("dynamo_kv", overlap_score_weight=2.0).overlap_score_weight == 2.0
    assert make_router("dynamo_kv", overlap_score_weight=0.0).overlap_score_credit == 0.0


def test_dynamo_with_full_host_credit_is_kvbms_merged_device_view():
    """KVBM (docs/components/router/router-offloading.md): a block held in host memory stays
    in the router's index as a device block: the cost equals a GPU-only index holding it."""
    keys = list(range(20))
    merged = make_router("dynamo_kv", block_size=16, host_cache_hit_weight=1.0)
    merged.on_kv_event(0, BlockStored(keys=keys[:5]))
    merged.on_kv_event(0, BlockStored(keys=keys, medium=CPU))
    device = make_router("dynamo_kv", block_size=16)
    device.on_kv_event(0, BlockStored(keys=keys))
    c = ctx(keys + [99])
    assert merged.logits(c, views(1), [0]) == pytest.approx(device.logits(c, views(1), [0]))
