"""`anchorage sim --mode timed`: the --json contract (sequential fields kept, cluster fields
added) and clear errors."""

from __future__ import annotations

import argparse
import io
import json
from contextlib import redirect_stdout

import pytest

from anchorage.cli import CLIError
from anchorage.commands import sim as sim_cmd
from anchorage.trace.format import TraceHeader, write_trace
from tests.sim.test_timed import session_trace

SEQ_FIELDS = {"policy", "hit_rate", "token_hit_rate", "hit_blocks", "prompt_blocks",
              "evictions", "us_per_request", "requests", "oversize"}


def run_cli(*argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    sim_cmd.register(sub)
    args = parser.parse_args(["sim", *argv])
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = args.func(args)
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    p = tmp_path_factory.mktemp("t") / "s.jsonl"
    write_trace(p, session_trace(seed=9, sessions=6), TraceHeader(block_size=16))
    return str(p)


def test_timed_json_contract(trace):
    rc, out = run_cli("--trace", trace, "--mode", "timed", "--replicas", "2",
                      "--router", "round_robin,pooled", "--profile", "h200-llama3-8b",
                      "--policies", "lru,arc,belady", "--capacity-blocks", "40", "--json",
                      "--no-progress")
    assert rc == 0
    d = json.loads(out)
    for k in ("trace", "block_size", "capacity_blocks", "requests", "infinite_hit_rate",
              "results"):
        assert k in d
    assert d["mode"] == "timed" and d["replicas"] == 2 and d["capacity_blocks"] == 40
    assert [(r["router"], r["policy"]) for r in d["results"]] == [
        (ro, p) for ro in ("round_robin", "pooled") for p in ("lru", "arc", "belady")]
    for r in d["results"]:
        assert SEQ_FIELDS <= set(r)
        assert r["replicas"] == 2
        assert isinstance(r["ttft_p90_s"], float) and r["ttft_p90_s"] > 0
        assert isinstance(r["per_replica"], list) and len(r["per_replica"]) == 2
        assert r["requests"] == d["requests"]
        assert r["hit_tokens"] + r["recomputed_tokens"] == r["prefill_tokens"]
    pooled = [r for r in d["results"] if r["router"] == "pooled"]
    assert all("belady_gap" in r for r in pooled)
    assert not any("belady_gap" in r for r in d["results"] if r["router"] == "round_robin")


def test_timed_table_and_sequential_unchanged(trace):
    rc, out = run_cli("--trace", trace, "--mode", "timed", "--policies", "lru",
                      "--arrivals", "open", "--no-progress")
    assert rc == 0 and "TTFT mean" in out and "round_robin" in out
    rc, out = run_cli("--trace", trace, "--capacity-frac", "0.2", "--policies",
                      "lru,ttl", "--param", "ttl.ttl_s=5", "--json", "--no-progress")
    d = json.loads(out)
    assert "mode" not in d and [r["policy"] for r in d["results"]] == ["lru", "ttl"]
    assert all(set(r) >= SEQ_FIELDS for r in d["results"])


@pytest.mark.parametrize("argv, msg", [
    (["--mode", "timed", "--router", "nope"], "unknown router"),
    (["--mode", "timed", "--profile", "nope"], "unknown hardware profile"),
    (["--mode", "timed", "--replicas", "0"], "replicas must be"),
    (["--mode", "timed", "--param", "lru"], "expected POLICY.KEY=VALUE"),
    (["--mode", "timed", "--param", "ttl.nope=1", "--policies", "ttl"], "nope"),
    (["--mode", "timed", "--router", "agent", "--router-param", "nope=1"], "nope"),
    ([], "--capacity-blocks or --capacity-frac"),
])
def test_bad_input_is_a_clear_error(trace, argv, msg):
    with pytest.raises(CLIError, match=msg):
        run_cli("--trace", trace, "--no-progress", *argv)


def test_timed_prefix_aware_admission(trace):
    base = ["--trace", trace, "--mode", "timed", "--policies", "lru", "--capacity-blocks",
            "40", "--json", "--no-progress"]
    _, out = run_cli(*base)
    assert json.loads(out)["admission"] == "fcfs"
    rc, out = run_cli(*base, "--admission", "prefix-aware")
    d = json.loads(out)
    assert rc == 0 and d["admission"] == "prefix-aware"
    assert d["admission_ttft_target_s"] == 2.0          # the engine's default
    assert d["results"][0]["requests"] == d["requests"]
    _, out = run_cli(*base, "--admission", "prefix-aware", "--admission-ttft-target", "0")
    assert json.loads(out)["admission_ttft_target_s"] is None
    # the flag reaches the replicas: with every request arriving at once (open loop, time
    # compressed) a 1 ms target admits in arrival order, not by cached prefix
    flood = ["--admission", "prefix-aware", "--arrivals", "open", "--time-scale", "0.001"]
    _, tight = run_cli(*base, *flood, "--admission-ttft-target", "0.001")
    _, none = run_cli(*base, *flood, "--admission-ttft-target", "0")
    tight, none = json.loads(tight)["results"][0], json.loads(none)["results"][0]
    assert tight["hit_rate"] < none["hit_rate"] and tight["ttft_mean_s"] > none["ttft_mean_s"]
    with pytest.raises(CLIError, match="admission-ttft-target"):
        run_cli(*base, "--admission", "prefix-aware", "--admission-ttft-target", "-1")


def test_offline_policy_in_closed_loop_is_flagged_as_a_reference(trace, capsys):
    rc, out = run_cli("--trace", trace, "--mode", "timed", "--arrivals", "closed",
                      "--policies", "lru,belady", "--capacity-blocks", "40", "--json",
                      "--no-progress")
    assert rc == 0 and len(json.loads(out)["results"]) == 2  # stdout stays pure JSON
    err = capsys.readouterr().err
    assert "note: belady reads next uses from the trace" in err
    assert "note: lru" not in err
    rc, _ = run_cli("--trace", trace, "--mode", "timed", "--arrivals", "open",
                    "--policies", "belady", "--capacity-blocks", "40", "--json",
                    "--no-progress")
    assert rc == 0 and "note:" not in capsys.readouterr().err
