"""scripts/gpu/calibrate.py in its tiny CPU mode (the main venv's CPU torch): the JSON's
schema, the fit and error report it carries, and the profile it loads into."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anchorage.sim import calibration as cal
from anchorage.sim.costmodel import step_time_s
from anchorage.sim.profiles import HardwareProfile, get_profile
from anchorage.trace.format import TraceHeader, write_trace
from tests.sim.test_cli_timed import run_cli
from tests.sim.test_timed import session_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "calibrate.py"
TINY = get_profile("cpu-tiny")


def run_script(*argv, env=None, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal")
    # the budget is generous: a shared 2-core machine must not turn points into skips
    proc = run_script("--tiny", "--device", "cpu", "--budget-s", "400", env={"OUT": str(out)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = out / "cpu-tiny-calibration.json"  # the default name, under $OUT
    return path, json.loads(path.read_text()), proc.stdout


def test_json_schema(tiny_run):
    _, d, stdout = tiny_run
    assert d["format"] == cal.FORMAT and d["complete"] is True and d["profile"] == "cpu-tiny"
    m = TINY.model
    assert {k: d["model"][k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                       "ffn_hidden", "vocab")} == {
        "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
        "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab}
    assert d["device"]["type"] == "cpu" and d["device"]["torch"]
    assert set(d["method"]) >= {"prefill", "decode", "attention", "timing", "link", "fit"}
    assert d["phase_errors"] == {}
    assert set(d["phase_s"]) == {"decode", "link", "prefill", "depth_check"}
    assert d["estimate"]["total_s"] > 0 and d["elapsed_s"] > 0
    assert "fit: mfu" in stdout and "model vs measured, prefill" in stdout
    meas = d["measurements"]
    grid = d["settings"]
    assert {(p["new_tokens"], p["context_tokens"]) for p in meas["prefill"]} == {
        (n, c) for n in grid["prefill_new"] for c in grid["prefill_ctx"]}
    for p in meas["prefill"] + meas["decode"]:
        assert p["time_s"] > 0 and p["reps"] >= 3 and p["issue"] == "eager"
        assert p["time_s"] == pytest.approx(
            p["stack_s"] * m.layers / p["layers_timed"] + p["head_s"], rel=1e-12)
    assert {p["layers_timed"] for p in meas["prefill"]} == {grid["prefill_layers"]}
    [check] = meas["depth_check"]
    assert check["error_pct"] == pytest.approx(
        100 * (check["scaled_s"] - check["full_depth_s"]) / check["full_depth_s"])


def test_decode_shapes_beyond_the_kv_capacity_are_skipped_with_the_reason(tiny_run):
    _, d, _ = tiny_run
    cap = TINY.capacity_blocks * TINY.block_size
    grid = d["settings"]
    ran = {(p["batch"], p["context_tokens"]) for p in d["measurements"]["decode"]}
    over = {(b, c) for b in grid["decode_batch"] for c in grid["decode_ctx"]
            if b * (c + 1) > cap}
    assert over and ran == {(b, c) for b in grid["decode_batch"]
                            for c in grid["decode_ctx"]} - over
    skipped = {(s["batch"], s["context_tokens"]): s["reason"] for s in d["skipped"]}
    assert set(skipped) == over
    assert all("KV capacity" in r for r in skipped.values())


def test_link_points_each_direction_and_pattern(tiny_run):
    _, d, _ = tiny_run
    link = d["measurements"]["link"]
    assert link["pinned"] is False and link["duplex"] == []
    got = {(p["direction"], p["pattern"]) for p in link["points"]}
    assert got == {(dr, pa) for dr in cal.DIRECTIONS for pa in cal.LINK_PATTERNS}
    bb = TINY.kv_bytes_per_block
    assert {p["bytes"] for p in link["points"] if p["pattern"] == "blocks"} == {bb}
    assert {p["bytes"] for p in link["points"] if p["pattern"] == "pieces"} == {
        bb // (2 * TINY.model.layers)}
    for p in link["points"]:
        assert p["gb_s"] == pytest.approx(p["bytes"] * p["copies"] / p["time_s"] / 1e9)


def test_the_error_report_is_the_fitted_model_against_the_measurements(tiny_run):
    _, d, _ = tiny_run
    fit, errors, meas = d["fit"], d["errors"], d["measurements"]
    prof = TINY.with_(mfu=fit["mfu"], attn_mfu=fit["attn_mfu"], mbu=fit["mbu"],
                      step_overhead_s=fit["gpu_step_overhead_s"])
    for row, p in zip(errors["prefill"], meas["prefill"]):
        model = step_time_s(prof, [(p["new_tokens"], p["context_tokens"])])
        assert row["model_s"] == pytest.approx(model, rel=1e-12)
        assert row["error_pct"] == pytest.approx(100 * (model - p["time_s"]) / p["time_s"])
    for row, p in zip(errors["decode"], meas["decode"]):
        model = step_time_s(prof, [], [p["context_tokens"]] * p["batch"])
        assert row["model_s"] == pytest.approx(model, rel=1e-12)
    assert len(errors["prefill"]) == len(meas["prefill"])
    assert len(errors["decode"]) == len(meas["decode"])
    for kind in ("prefill", "decode", "link"):
        assert errors["summary"][kind] == cal.error_summary(errors[kind])
    # refitting the file's measurements gives the file's fit
    again = {"measurements": meas}
    cal.fit_document(again, TINY)
    assert again["fit"]["mfu"] == pytest.approx(fit["mfu"], rel=1e-12)
    assert again["fit"]["mbu"] == pytest.approx(fit["mbu"], rel=1e-12)


def test_the_file_loads_into_a_profile_and_a_timed_run(tiny_run, tmp_path):
    path, d, _ = tiny_run
    prof = HardwareProfile.from_calibration(str(path))
    assert prof.name == "cpu-tiny" and prof.measured and prof.mfu == d["fit"]["mfu"]
    assert prof.step_overhead_s == pytest.approx(d["fit"]["gpu_step_overhead_s"]
                                                 + TINY.step_overhead_s)
    assert prof.host_d2h_bytes_s == d["fit"]["link"]["blocks"]["d2h"]["bytes_s"]
    trace = tmp_path / "s.jsonl"
    write_trace(trace, session_trace(seed=1, sessions=3), TraceHeader(block_size=16))
    rc, out = run_cli("--trace", str(trace), "--mode", "timed", "--profile", "cpu-tiny",
                      "--calibration", str(path), "--policies", "lru", "--json",
                      "--no-progress")
    res = json.loads(out)
    assert rc == 0 and res["profile_source"].startswith("measured: ")
    assert res["results"][0]["requests"] == 15


def test_estimate_needs_no_torch_and_fits_the_budget():
    proc = run_script("--estimate")
    assert proc.returncode == 0, proc.stderr
    est = json.loads(proc.stdout)
    assert est["profile"] == "h200-llama3-8b"
    # the H200 grid, by the derived profile, well inside the 450 s budget
    assert 0 < est["estimate"]["total_s"] < 450
    assert est["estimate"]["prefill_s"] > est["estimate"]["decode_s"] > 0


def test_core_and_estimate_import_no_torch():
    code = ("import runpy, sys\n"
            "import anchorage.sim.calibration, anchorage.sim.profiles, anchorage.commands.sim\n"
            f"sys.argv = ['calibrate.py', '--estimate']\n"
            f"try:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("no torch")


def test_the_stack_attends_causally_over_its_cache():
    """A chunk after cached context, and a decode step, give what one pass over the whole
    sequence gives: the cache and the lower-right causal alignment are right."""
    import dataclasses

    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    from decoder_stack import Stack

    spec = dataclasses.replace(TINY.model, kv_heads=2)  # GQA: 4 query heads, 2 KV heads
    for impl in ("gqa", "expand"):
        st = Stack(spec, 1, torch.device("cpu"), dtype=torch.float32, attn_impl=impl)
        w = st.layers[0]
        c, n = 24, 8
        x = torch.randn(c + n + 1, spec.hidden)
        whole = st.layer(x[:c + n], w, st.kv_cache(1, c + n + 1)[0], 0, st.rope_tables(0, c + n))
        cache = st.kv_cache(1, c + n + 1)[0]
        st.layer(x[:c], w, cache, 0, st.rope_tables(0, c))
        chunk = st.layer(x[c:c + n], w, cache, c, st.rope_tables(c, n))
        assert torch.allclose(chunk, whole[c:], atol=1e-5), impl
        step = st.layer(x[c + n:], w, cache, c + n, st.rope_tables(c + n, 1))
        ref = st.layer(x, w, st.kv_cache(1, c + n + 1)[0], 0, st.rope_tables(0, c + n + 1))
        assert torch.allclose(step, ref[-1:], atol=1e-5), impl
