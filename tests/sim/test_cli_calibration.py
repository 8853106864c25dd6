"""End to end: a calibration file -> a measured profile -> `anchorage sim --mode timed`
runs on the fitted coefficients (step times, host link)."""

from __future__ import annotations

import json

import pytest

from anchorage.cli import CLIError
from anchorage.sim.costmodel import step_time_s
from anchorage.sim.profiles import HardwareProfile, get_profile
from anchorage.trace.format import TraceHeader, TraceRecord, write_trace
from tests.sim.test_calibration import document, link_points, synthetic
from tests.sim.test_cli_timed import run_cli
from tests.sim.test_timed import session_trace

BS = 16
PROMPT = 160
OUTPUT = 3


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "h200-calibration.json"
    path.write_text(json.dumps(document(*synthetic(), link_points())))
    return str(path)


@pytest.fixture(scope="module")
def one_request(tmp_path_factory):
    """One request alone on one replica: its TTFT is one prefill step, its latency that
    plus its decode steps, so they show the profile's step times exactly."""
    p = tmp_path_factory.mktemp("t") / "one.jsonl"
    write_trace(p, [TraceRecord(timestamp=0.0, hash_ids=list(range(PROMPT // BS)),
                                input_length=PROMPT, output_length=OUTPUT, session_id="s")],
                TraceHeader(block_size=BS))
    return str(p)


def timed(trace, *argv):
    rc, out = run_cli("--trace", trace, "--mode", "timed", "--arrivals", "open",
                      "--policies", "lru", "--json", "--no-progress", *argv)
    assert rc == 0
    return json.loads(out)


def expected(profile):
    p = profile.with_(block_size=BS)
    ttft = step_time_s(p, [(PROMPT, 0)])
    return ttft, ttft + sum(step_time_s(p, [], [PROMPT + i]) for i in range(OUTPUT - 1))


def test_timed_run_uses_the_fitted_coefficients(one_request, calibration):
    measured = HardwareProfile.from_calibration(calibration)
    base = get_profile("h200-llama3-8b")
    d = timed(one_request, "--calibration", calibration)
    r = d["results"][0]
    ttft, latency = expected(measured)
    assert r["ttft_mean_s"] == pytest.approx(ttft, rel=1e-12)
    assert r["latency_mean_s"] == pytest.approx(latency, rel=1e-12)
    assert d["profile"] == "h200-llama3-8b" and d["calibration"] == calibration
    assert d["profile_source"].startswith(f"measured: {calibration}")
    # the derived profile gives other times: the run really switched profiles
    d0 = timed(one_request)
    assert d0["profile_source"].startswith("derived: ") and d0["calibration"] is None
    assert d0["results"][0]["ttft_mean_s"] == pytest.approx(expected(base)[0], rel=1e-12)
    assert abs(d0["results"][0]["ttft_mean_s"] - ttft) > 0.05 * ttft
    # --profile FILE is the same as --calibration FILE
    d2 = timed(one_request, "--profile", calibration)
    assert d2["results"][0]["ttft_mean_s"] == r["ttft_mean_s"]
    assert d2["calibration"] == calibration


def test_tiering_takes_the_measured_host_link(calibration, tmp_path):
    trace = tmp_path / "s.jsonl"
    write_trace(trace, session_trace(seed=3, sessions=4), TraceHeader(block_size=BS))
    measured = HardwareProfile.from_calibration(calibration)
    argv = ["--tiering", "naive", "--capacity-blocks", "40"]
    t = timed(str(trace), "--calibration", calibration, *argv)["results"][0]["tiering"]
    assert t["d2h_bytes_s"] == measured.host_d2h_bytes_s
    assert t["h2d_bytes_s"] == measured.host_h2d_bytes_s
    t = timed(str(trace), "--calibration", calibration, "--host-bw-gbs", "10",
              *argv)["results"][0]["tiering"]
    assert t["d2h_bytes_s"] == t["h2d_bytes_s"] == 10e9
    t = timed(str(trace), *argv)["results"][0]["tiering"]  # derived: the 25 GB/s default
    assert t["d2h_bytes_s"] == t["h2d_bytes_s"] == 25e9


def test_calibration_errors_are_clear(one_request, calibration, tmp_path):
    with pytest.raises(CLIError, match="measured h200-llama3-8b, not --profile cpu-tiny"):
        timed(one_request, "--profile", "cpu-tiny", "--calibration", calibration)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "x"}))
    with pytest.raises(CLIError, match="not an anchorage-calibration/v1 file"):
        timed(one_request, "--calibration", str(bad))
    with pytest.raises(CLIError, match="cannot read calibration file"):
        timed(one_request, "--profile", str(tmp_path / "none.json"))
