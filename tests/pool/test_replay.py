"""Unit tests of the sequential replay (anchorage.sim.replay) and the `anchorage sim` CLI."""

from __future__ import annotations

import json

import pytest

from anchorage.cli import main
from anchorage.policies.registry import make_policy
from anchorage.sim.replay import infinite_hit_rate, make_contexts, replay, run_policies
from anchorage.trace.format import TraceHeader, TraceRecord, write_trace

BS = 4


def rec(ts, hash_ids, out=1, **kw):
    return TraceRecord(timestamp=ts, hash_ids=hash_ids, output_length=out,
                       input_length=kw.pop("input_length", len(hash_ids) * BS), **kw)


def test_make_contexts_tenants_and_clock():
    recs = [rec(1500, [1, 2], tenant="t1", session_id="s", agent="planner"),
            rec(2000, [1, 2], tenant="t2"), rec(2500, [1, 2])]
    cs = make_contexts(recs)
    assert [c.seq for c in cs] == [0, 1, 2] and cs[0].now_s == 1.5
    assert cs[0].keys == [("t1", 1), ("t1", 2)] and cs[1].keys == [("t2", 1), ("t2", 2)]
    assert cs[2].keys == [1, 2]
    assert cs[0].agent_truth == "planner" and cs[0].agent_hint is None
    assert cs[0].session_id == "s"
    shared = make_contexts(recs, isolate_tenants=False)
    assert shared[0].keys == shared[1].keys == [1, 2]


def test_infinite_hit_rate_by_hand():
    cs = make_contexts([rec(0, [1, 2, 3]), rec(1, [1, 2, 3]), rec(2, [1, 9, 3]),
                        rec(3, [7], input_length=BS)])
    # req1: 3 cached but capped one block short -> 2 hits; req2: 1 then miss at 9 -> 1
    assert infinite_hit_rate(cs, BS) == pytest.approx(3 / 10)
    assert infinite_hit_rate([], BS) == 0.0


def test_replay_counts_and_capacity():
    cs = make_contexts([rec(0, [1, 2, 3], out=1), rec(1, [1, 2, 3, 4], out=1),
                        rec(2, [5, 6], out=1), rec(3, [1, 2, 3, 4], out=1)])
    big = replay(cs, 100, BS, make_policy("lru"), check_every=1)
    assert big.requests == 4 and big.prompt_blocks == 13
    assert big.hit_blocks == 3 + 3 and big.evictions == 0
    assert big.hit_rate == pytest.approx(6 / 13) == pytest.approx(infinite_hit_rate(cs, BS))
    assert big.token_hit_rate == pytest.approx(6 * BS / (13 * BS))
    small = replay(cs, 4, BS, make_policy("lru"), check_every=1)
    # [5, 6] evicts keys 4 and 3 (LRU, tail first); the last request then hits 1, 2 only
    assert small.hit_blocks == 3 + 2 and small.evictions == 4
    assert small.hit_blocks <= big.hit_blocks


def test_replay_oversize_and_generation_cap():
    cs = make_contexts([rec(0, [1, 2, 3, 4, 5], out=1), rec(1, [1, 2], out=1000),
                        rec(2, [1, 2], out=1)])
    r = replay(cs, 4, BS, make_policy("lru"), check_every=1)
    assert r.oversize == 1 and r.requests == 3  # 5 prompt blocks never fit in 4
    # request 1 generates until the pool is full (vLLM's max_model_len), then frees
    assert r.hit_blocks == 1 and r.prompt_blocks == 9


def test_replay_output_blocks_occupy_the_cache():
    cs = make_contexts([rec(0, [1], out=1), rec(1, [2], out=3 * BS + 1), rec(2, [1], out=1)])
    with_out = replay(cs, 4, BS, make_policy("lru"), include_output=True)
    without = replay(cs, 4, BS, make_policy("lru"), include_output=False)
    assert without.hit_blocks == 0  # [1] alone: capped, no hit possible
    cs2 = make_contexts([rec(0, [1, 8], out=1), rec(1, [2], out=3 * BS + 1),
                         rec(2, [1, 8], out=1)])
    assert replay(cs2, 4, BS, make_policy("lru"), include_output=False).hit_blocks == 1
    assert replay(cs2, 4, BS, make_policy("lru"), include_output=True).hit_blocks == 0
    assert with_out.evictions >= without.evictions


def test_run_policies_names_and_belady_needs_contexts():
    cs = make_contexts([rec(i, [i % 3, 10 + i % 2]) for i in range(30)])
    res = run_policies(cs, 3, BS, ["lru", "belady"])
    assert [r.policy for r in res] == ["lru", "belady"]
    assert res[1].hit_blocks >= res[0].hit_blocks
    with pytest.raises(ValueError, match="needs the whole replay"):
        make_policy("belady", block_size=BS)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")


# -- the CLI --------------------------------------------------------------------------------

@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "t.jsonl"
    recs = [rec(i * 10, [i % 4, 100 + i % 3, 200 + i], out=2, session_id=f"s{i % 2}")
            for i in range(40)]
    write_trace(p, recs, TraceHeader(block_size=BS, source="test"))
    return p


def test_sim_json_contract(trace_file, capsys):
    rc = main(["sim", "--trace", str(trace_file), "--capacity-blocks", "6",
               "--policies", "lru,belady", "--json", "--no-progress"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for k in ("trace", "block_size", "capacity_blocks", "requests", "infinite_hit_rate",
              "results"):
        assert k in out
    assert out["block_size"] == BS and out["capacity_blocks"] == 6 and out["requests"] == 40
    assert [r["policy"] for r in out["results"]] == ["lru", "belady"]
    for r in out["results"]:
        for k in ("policy", "hit_rate", "token_hit_rate", "hit_blocks", "prompt_blocks",
                  "evictions", "us_per_request"):
            assert k in r
        assert 0 <= r["hit_rate"] <= out["infinite_hit_rate"] + 1e-12
        assert r["prompt_blocks"] == 120
    lru, bel = out["results"]
    assert bel["hit_blocks"] >= lru["hit_blocks"] and lru["evictions"] > 0


def test_sim_table(trace_file, capsys):
    assert main(["sim", "--trace", str(trace_file), "--capacity-frac", "0.1",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "hit rate" in text and "lru" in text and "belady" in text
    assert "infinite-cache hit rate" in text


@pytest.mark.parametrize("args,needle", [
    (["--capacity-blocks", "6", "--policies", "lru,bogus"], "unknown policy bogus"),
    (["--capacity-blocks", "0"], "--capacity-blocks must be positive"),
    (["--capacity-blocks", "-3"], "--capacity-blocks must be positive"),
    (["--capacity-frac", "0"], "--capacity-frac must be > 0"),
    (["--capacity-blocks", "6", "--block-size", "0"], "--block-size must be positive"),
])
def test_sim_bad_arguments(trace_file, capsys, args, needle):
    assert main(["sim", "--trace", str(trace_file), "--no-progress", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_sim_missing_and_malformed_file(tmp_path, capsys):
    assert main(["sim", "--trace", str(tmp_path / "none.jsonl"), "--capacity-blocks", "4",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such file" in err and len(err.splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "hash_ids": [1], "output_length": 1}\n{oops\n')
    assert main(["sim", "--trace", str(bad), "--capacity-blocks", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{bad}:2" in err and len(err.splitlines()) == 1
