"""The cost model's arithmetic and the profiles' derived numbers."""

from __future__ import annotations

import pytest

from anchorage.sim.costmodel import step_time_s
from anchorage.sim.profiles import PROFILES, get_profile


def test_profiles_derive_kv_capacity_from_memory():
    p = get_profile("h200-llama3-8b")
    assert p.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert p.kv_bytes_per_block == 16 * 131072
    expected = (141e9 * 0.9 - 8.03e9 * 2 - 4e9) // (16 * 131072)
    assert p.capacity_blocks == int(expected)
    p70 = get_profile("h100-llama3-70b-tp4")
    assert p70.model.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert p70.capacity_blocks == int((4 * 80e9 * 0.9 - 70.6e9 * 2 - 4 * 4e9)
                                      // (16 * p70.model.kv_bytes_per_token))
    assert get_profile("cpu-tiny").capacity_blocks == 256
    assert p.with_(capacity_blocks_override=7).capacity_blocks == 7
    with pytest.raises(ValueError, match="unknown hardware profile"):
        get_profile("tpu")
    assert set(PROFILES) >= {"h200-llama3-8b", "h100-llama3-70b-tp4", "cpu-tiny"}


def test_prefill_is_compute_bound_and_matches_formula():
    p = get_profile("h200-llama3-8b")
    m = p.model
    n, c = 4096, 1024
    flops = 2 * m.params * n + 4 * m.layers * m.hidden * n * (c + (n + 1) / 2)
    expect = flops / (p.peak_flops * p.mfu) + p.step_overhead_s
    assert step_time_s(p, [(n, c)]) == pytest.approx(expect, rel=1e-12)


def test_decode_is_bandwidth_bound_and_matches_formula():
    p = get_profile("h200-llama3-8b")
    m = p.model
    ctxs = [2000] * 32
    nbytes = m.weight_bytes + m.kv_bytes_per_token * (sum(c + 1 for c in ctxs) + len(ctxs))
    expect = nbytes / (p.mem_bw_bytes_s * p.mbu) + p.step_overhead_s
    assert step_time_s(p, [], ctxs) == pytest.approx(expect, rel=1e-12)


def test_cost_grows_with_context_and_hits_save_time():
    p = get_profile("h200-llama3-8b")
    # a cache hit of 3,000 tokens turns a 4,000-token prefill into a 1,000-token one
    full = step_time_s(p, [(4000, 0)])
    hit = step_time_s(p, [(1000, 3000)])
    assert hit < full / 2
    assert step_time_s(p, [], [8000]) > step_time_s(p, [], [100])
    assert step_time_s(p, [], []) == 0.0


def test_tensor_parallel_adds_allreduce_time():
    p = get_profile("h100-llama3-70b-tp4")
    m = p.model
    base = p.with_(link_bw_bytes_s=0.0)
    t_tp, t_no = step_time_s(p, [(512, 0)]), step_time_s(base, [(512, 0)])
    comm = 2 * m.layers * (p.link_latency_s + 2 * 3 / 4 * 512 * m.hidden * 2 / p.link_bw_bytes_s)
    assert t_tp - t_no == pytest.approx(comm, rel=1e-9)
