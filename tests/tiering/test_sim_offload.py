"""The simulator's host tier as vLLM's offloading connector runs it (``mode="offload"`` of
``run_tiered``, ``anchorage.tiering.sim_offload``): counters that add up, host memory that
never overflows, and the host policies' choices on a workload where recency and expected
return disagree."""

from __future__ import annotations

import pytest

from anchorage.sim.cluster import TimedConfig
from anchorage.sim.profiles import PROFILES
from anchorage.sim.replay import make_contexts
from anchorage.tiering.host_tier import HostTierConfig, block_bytes
from anchorage.tiering.offload_replay import sequential
from anchorage.tiering.params import TieringConfig
from anchorage.tiering.sim import run_tiered
from anchorage.trace.format import TraceRecord

BS = 32


def two_tools(sessions: int = 16, turns: int = 6):
    """Sessions whose turns end in a fast tool (1 s) or a slow one (20 s), alternating by
    session; more history than the device pool and host memory hold."""
    recs, hid = [], [0]

    def ids(n):
        out = list(range(hid[0], hid[0] + n))
        hid[0] += n
        return out

    for s in range(sessions):
        tool, gap = ("fast", 1.0) if s % 2 else ("slow", 20.0)
        hist, t = ids(10), 0.7 * s
        for k in range(turns):
            last = k == turns - 1
            recs.append(TraceRecord(timestamp=t * 1000, hash_ids=list(hist),
                                    input_length=len(hist) * BS + 3, output_length=2,
                                    session_id=f"s{s}", tool_name=None if last else tool,
                                    tool_duration_ms=None if last else gap * 1000))
            t += gap + 0.5
            hist += ids(2)
    recs.sort(key=lambda r: r.timestamp)
    return recs


def run(recs, host_policy, host_blocks, reload_ahead=False):
    prof = PROFILES["cpu-tiny"].with_(capacity_blocks_override=64, block_size=BS)
    bb = block_bytes(prof.model, BS)
    cfg = TimedConfig(prof, replicas=1, mode="closed", capacity_blocks=64)
    t = TieringConfig(mode="offload", host_policy=host_policy, reload_ahead=reload_ahead,
                      host=HostTierConfig(capacity_bytes=host_blocks * bb))
    return run_tiered(recs, make_contexts(recs), cfg, "lru", "session", tiering=t), bb


@pytest.mark.parametrize("policy", ["lru", "arc", "anchorage", "oracle"])
def test_the_counters_add_up_and_host_memory_never_overflows(policy):
    recs = two_tools()
    res, bb = run(recs, policy, 96, reload_ahead=policy == "anchorage")
    assert res["requests"] == len(recs)
    assert res["offload_bytes"] == res["offload_blocks"] * bb
    assert res["reload_bytes"] == res["reload_blocks"] * bb
    assert res["bytes_moved"] == res["offload_bytes"] + res["reload_bytes"]
    assert res["host_hit_blocks"] <= res["reload_blocks"], "every host hit was loaded"
    assert res["host_evictions"] > 0, "the host tier never filled"
    assert res["offload_blocks"] - res["host_evictions"] <= 96, "more chunks than host memory"
    assert res["prompt_blocks"] >= res["hit_blocks"] + res["host_hit_blocks"]
    assert res["tiering"]["host_policy"] == policy


def test_anchorage_keeps_what_returns_soon_where_lru_keeps_what_was_used_last():
    recs = two_tools()
    lru, _ = run(recs, "lru", 96)
    anch, _ = run(recs, "anchorage", 96)
    assert anch["host_hit_blocks"] > 1.2 * lru["host_hit_blocks"], (anch["host_hit_blocks"],
                                                                   lru["host_hit_blocks"])
    assert anch["recomputed_tokens"] < lru["recomputed_tokens"]


def test_without_host_memory_pressure_every_policy_is_the_same():
    recs = two_tools(sessions=10, turns=4)
    hits = {p: run(recs, p, 4096)[0]["host_hit_blocks"] for p in ("lru", "arc", "anchorage")}
    assert len(set(hits.values())) == 1 and hits["lru"] > 0


def test_the_sequential_replay_reports_per_request_hits():
    recs = two_tools(sessions=4, turns=3)
    out = sequential(recs, 64, BS, 32, "anchorage")
    assert len(out["requests"]) == len(recs)
    assert sum(r["host"] for r in out["requests"]) == out["counters"]["reload_blocks"]
    assert out["used_chunks"] <= 32


def test_a_bad_host_policy_name_is_rejected():
    with pytest.raises(ValueError, match="host_policy must be one of"):
        TieringConfig(mode="offload", host_policy="mru")
