"""The host tier's scheduler-side tracker (``node_agent/offload/tracker.py``, no engine)
and its snapshot on the sidecar: counters to /metrics, just-in-time reloads sent as
warm-ups with the session's prompt (fake engine on loopback)."""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import pytest

from anchorage.node_agent.offload.config import HostTierConfigError, OffloadConfig, transfer_config
from anchorage.node_agent.offload.tracker import HostTierTracker, parse_host_tier
from anchorage.tiering.controller import PoolReading, SessionReading
from anchorage.tiering.host_tier import HostTierConfig
from anchorage.tiering.params import TemporalParams
from anchorage.tiering.returns import SessionReturns
from tests.node_agent.test_sidecar import env, make, metric, until  # noqa: F401 (fixture)

TOKS = list(range(3, 60))


def tracker() -> HostTierTracker:
    params = TemporalParams(host=HostTierConfig(capacity_bytes=64 * 4096))
    return HostTierTracker(SessionReturns(params), capacity_chunks=64, chunk_bytes=4096,
                           policy_name="anchorage", occupancy=lambda: 17)


def readings(sid):
    return (PoolReading(capacity_blocks=100, free_blocks=5, cached_free_blocks=5,
                        block_bytes=4096),
            SessionReading(gpu_blocks=10, copy_blocks=0, recompute_s=math.inf),
            [f"{sid}-{i}" for i in range(10)])


def test_the_tracker_counts_hits_outcomes_and_plans_stalls():
    t = tracker()
    now = 100.0
    meta = {"session": "s1", "tool": "grep", "cache_salt": "salt"}
    t.arrived("r1", meta, TOKS, now)
    t.allocated("r1", 0, 64, 32)
    t.finished("r1", now + 1, readings)  # a tool stall: planned, accepted under pressure
    assert t.ctl.gate["ok"] == 1 and t.ctl.pins
    st = t.ctl.stalls["s1"]
    assert st.reload_at is not None
    pend = t.pending_reloads(now + 1, 5000.0)
    assert pend and pend[0]["token_ids"] == TOKS and pend[0]["cache_salt"] == "salt"
    t.arrived("w1", {"session": "s1", "warmup": True}, TOKS, now + 2)  # the warm-up
    assert not t.pending_reloads(now + 2, 5000.0), "its reload started"
    t.allocated("w1", 0, 64, 32)   # the warm-up loaded the prefix
    t.finished("w1", now + 2, readings)
    t.arrived("r2", {"session": "s1"}, TOKS + [1], now + 3)
    t.allocated("r2", 64, 0, 32)   # the real request: all on GPU
    assert t.outcomes == {"late": 1, "in_time": 1}
    assert t.hit_blocks == 4 and not t.ctl.pins, "back: the pin is released"
    t.transferred(4096, 8192, 1, 2)
    t.failed({"load_failures": 1})
    v = parse_host_tier(json.loads(json.dumps(t.view(now + 4, 5000.0))))
    assert v["hits"] == {"tokens": 128, "blocks": 4} and v["used_chunks"] == 17
    assert v["bytes"] == {"d2h": 4096, "h2d": 8192} and v["fallbacks"]["load_failed"] == 1
    assert v["sync_loads"] == 0


def test_the_snapshot_reader_rejects_a_bad_document():
    with pytest.raises(ValueError, match="not an anchorage-host-tier/v1"):
        parse_host_tier({"format": "x"})
    good = tracker().view(0.0, 1.0)
    good["capacity_chunks"] = "many"
    with pytest.raises(ValueError, match="malformed"):
        parse_host_tier(good)


@pytest.mark.parametrize("anch,field", [
    ({"transfer_timeout_s": 0}, "anchorage.transfer_timeout_s"),
    ({"link_gbs": "fast"}, "anchorage.link_gbs"),
    ({"enabled": "yes"}, "anchorage.enabled"),
    ({"state_dir": ""}, "anchorage.state_dir"),
    ({"node_pool_growth": 0}, "anchorage.node_pool_growth"),
    ({"node_pool_growth": 1.5}, "anchorage.node_pool_growth"),
    ({"sync_load_max_ms": -1}, "anchorage.sync_load_max_ms"),
    ({"sync_load_max_ms": float("inf")}, "anchorage.sync_load_max_ms"),
    ({"sync_load_max_ms": True}, "anchorage.sync_load_max_ms"),
    ({"nope": 1}, "unknown key(s) nope"),
])
def test_bad_anchorage_keys_name_the_field(anch, field):
    ec = transfer_config(1 << 20, anchorage=anch)["kv_connector_extra_config"]
    with pytest.raises(HostTierConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        OffloadConfig.from_extra_config(ec)


def test_the_transfer_config_is_what_vllm_reads():
    c = transfer_config(1 << 30, anchorage={"reload_ahead": False})
    ec = c["kv_connector_extra_config"]
    assert c["kv_connector"] == "AnchorageOffloadingConnector"
    assert c["kv_load_failure_policy"] == "recompute"
    assert ec["eviction_policy"] == "AnchorageCachePolicy"
    assert ec["spec_name"] == "AnchorageOffloadingSpec"
    assert OffloadConfig.from_extra_config(ec) == OffloadConfig(
        reload_ahead=False, cpu_bytes_to_use=1 << 30)
    assert OffloadConfig().sync_load_max_ms == 0.0  # anchorage.tiering.loads' default: off
    for v in (0, 0.5, 10):
        ec = transfer_config(1 << 30, anchorage={"sync_load_max_ms": v})[
            "kv_connector_extra_config"]
        assert OffloadConfig.from_extra_config(ec).sync_load_max_ms == v
    stock = transfer_config(1 << 30, policy="lru", connector="stock", spec="vllm")
    assert stock == {"kv_role": "kv_both", "kv_connector": "OffloadingConnector",
                     "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30,
                                                   "eviction_policy": "lru"}}


def test_the_sidecar_exports_the_host_tier_and_sends_its_reloads(env):  # noqa: F811
    eng, tmp = env
    t = tracker()
    t.arrived("r1", {"session": "s9", "tool": "grep", "cache_salt": "salt-9"}, TOKS, 10.0)
    t.allocated("r1", 0, 96, 32)
    t.finished("r1", 10.5, readings)
    st = t.ctl.stalls["s9"]
    st.reload_at = 10.5 + 0.6  # due 0.6 s from now
    t.transferred(1 << 20, 3 << 20, 4, 3)
    t.sync_loads = 2  # the connector counts them (tests/node_agent/test_host_tier_engine.py)
    path = str(tmp / "host_tier.json")
    assert t.maybe_write(path, 0.0, 10.5, force=True)

    async def main():
        sc = make(tmp, eng)
        await sc.start()
        loop = asyncio.create_task(sc.run_loop())
        try:
            await until(lambda: sc.host_tier is not None and sc.ticks >= 2, "the snapshot")
            async with httpx.AsyncClient() as c:
                text = (await c.get(f"http://127.0.0.1:{sc.port}/metrics")).text
            assert metric(text, "anchorage_host_tier_hits_total", unit="blocks") == 3
            assert metric(text, "anchorage_host_tier_loads_total", outcome="late") == 1
            assert metric(text, "anchorage_host_tier_bytes_total", direction="h2d") == 3 << 20
            assert metric(text, "anchorage_host_tier_used_chunks") == 17
            assert metric(text, "anchorage_host_tier_sync_loads_total") == 2
            assert metric(text, "anchorage_host_tier_capacity_bytes") == 64 * 4096
            assert metric(text, "anchorage_host_tier_stalls_total", decision="ok") == 1
            assert metric(text, "anchorage_host_tier_fallbacks_total", reason="timeout") == 0
            await until(lambda: len(eng.completions) == 1, "the reload warm-up")
            body = eng.completions[0]
            assert body["prompt"] == TOKS and body["session_id"] == "s9"
            assert body["cache_salt"] == "salt-9" and body["vllm_xargs"]["anchorage.warmup"] == 1
        finally:
            sc.request_stop()
            await loop
            await sc.stop()

    t0 = time.time()
    asyncio.run(main())
    assert time.time() - t0 < 30
