import pytest

from anchorage.sim.profiles import get_profile
from anchorage.tiering.host_tier import (
    HostTier,
    HostTierConfig,
    Link,
    block_bytes,
    lru_hosts,
    pool_hosts,
    share_hosts,
    recompute_s,
)


def test_block_bytes_from_the_model_profile():
    prof = get_profile("h200-llama3-8b")
    # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes x 16 tokens = 2 MiB
    assert block_bytes(prof.model, 16) == 2 * 1024 * 1024
    assert block_bytes(prof.model, 16) == prof.kv_bytes_per_block


def test_link_is_fifo_and_overlaps_nothing_else():
    link = Link(1e9, latency_s=0.001)
    assert link.schedule(0.0, 1e9) == pytest.approx(1.001)
    assert link.schedule(0.5, 1e9) == pytest.approx(2.002)  # queued behind the first
    assert link.schedule(5.0, 0) == pytest.approx(5.001)
    assert link.bytes == 2 * 10**9 and link.transfers == 3


def test_host_tier_holds_keys_lru_and_bounded():
    h = HostTier(HostTierConfig(capacity_bytes=3 * 100), bytes_per_block=100)
    assert h.capacity_blocks == 3
    h.store(["a", "b", "c"])
    assert h.run(["a", "b", "x"], 0, 3) == 2   # refreshes a, b
    h.store(["d"])                              # drops c, the least recently used
    assert "c" not in h and "a" in h and "d" in h
    assert h.free_blocks == 0 and h.dropped_blocks == 1
    assert h.run(["a", "b", "d"], 1, 3) == 2
    assert h.round_trip_s(2, 3) == pytest.approx(
        h.d2h.duration(200) + h.h2d.duration(300))


def test_pooled_host_tiers_share_keys_and_capacity_but_not_links():
    a = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    b = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    a.store(["x"])
    pool_hosts([a, b])
    assert a.capacity_blocks == b.capacity_blocks == 4
    assert "x" in b                               # what a held, b now reaches
    b.store(["y", "z", "w"])
    assert a.run(["x", "y", "z", "w"], 0, 4) == 4 and a.free_blocks == b.free_blocks == 0
    a.store(["v"])                                # LRU over the pool: x (refreshed first) goes
    assert "x" not in b and "v" in b
    assert a.h2d is not b.h2d and a.d2h is not b.d2h   # each GPU's own link


def test_shared_host_tiers_read_each_other_keep_their_own_capacity_and_one_copy():
    a = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    b = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    a.store(["x", "y"])
    assert b.run(["x", "y", "z"], 0, 3) == 0       # not shared yet
    share_hosts([a, b])
    assert a.capacity_blocks == b.capacity_blocks == 2
    b.store(["z"])
    assert b.run(["x", "y", "z"], 0, 3) == 3        # a's keys, then its own
    assert b.held("x") and not b.held("w") and "x" not in b
    b.store(["x", "w"])                              # x is a's: not copied again
    assert list(b.keys) == ["z", "w"] and b.stored_blocks == 2
    b.store(["v"])                                   # b's own LRU drops z; a keeps x, y
    assert "z" not in b and list(a.keys) == ["x", "y"]
    a.store(["u"])                                   # a's order: x goes (b's reads of x
    assert not b.held("x") and b.held("y")           # did not refresh it)
    assert b.run(["x", "y"], 0, 2) == 0 and b.run(["y", "w"], 0, 2) == 2
    assert a.h2d is not b.h2d and a.d2h is not b.d2h


def test_node_lru_tiers_grow_into_the_nodes_capacity_and_drop_the_nodes_oldest():
    a = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    b = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    a.store(["x"])
    lru_hosts([a, b])
    a.store(["y", "z"])                              # past a's own 2: the node has 4
    assert list(a.keys) == ["x", "y", "z"] and a.free_blocks == b.free_blocks == 1
    b.store(["w"])
    assert b.run(["x"], 0, 1) == 1                    # b's read refreshes x in a's order
    b.store(["y", "v"])                               # y is a's (one copy); v: the node is
    assert "v" in b and "y" in a                      # full, its oldest goes: z (a's)
    assert "z" not in a and list(a.keys) == ["x", "y"]
    assert a.dropped_blocks == 1 and b.dropped_blocks == 0
    assert a.stored_blocks == 3 and b.stored_blocks == 2
    # the same stores with the node pool (share_hosts): a stays within its own 2, and b's
    # read does not save x
    c = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    d = HostTier(HostTierConfig(capacity_bytes=2 * 100), bytes_per_block=100)
    c.store(["x"])
    share_hosts([c, d])
    c.store(["y", "z"])
    assert list(c.keys) == ["y", "z"]


def test_bad_config():
    with pytest.raises(ValueError):
        HostTierConfig(d2h_bytes_s=0)
    with pytest.raises(ValueError):
        HostTierConfig(capacity_bytes=-1)


def test_recompute_time_is_the_prefill_compute_and_grows_with_context():
    prof = get_profile("h200-llama3-8b")
    assert recompute_s(prof, 0, 0) == 0.0
    one = recompute_s(prof, 0, 16)
    m = prof.model
    flops = 16 * (2 * m.params + 4 * m.layers * m.hidden * 17 / 2)
    assert one == pytest.approx(flops / (prof.peak_flops * prof.mfu))
    # a Llama-3-8B block on an H200 takes over 5x its 25 GB/s transfer time to recompute
    link = Link(HostTierConfig().h2d_bytes_s).duration(block_bytes(m, 16))
    assert 5.0 < one / link < 6.0
    # attention: the same block after 30k tokens of context costs about twice as much
    assert 1.9 < recompute_s(prof, 30_000, 16) / one < 2.1
