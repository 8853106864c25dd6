"""Fitting the cost model to measurements (anchorage.sim.calibration), profiles from
calibration files, and a timed simulation that runs on the fitted coefficients."""

from __future__ import annotations

import json
import random

import pytest

from anchorage.sim import calibration as cal
from anchorage.sim.costmodel import compute_time_s, prefill_flops, step_time_s
from anchorage.sim.profiles import PROFILES, HardwareProfile, get_profile
from anchorage.tiering.host_tier import HostTierConfig, recompute_s

BASE = get_profile("h200-llama3-8b")
TRUE = BASE.with_(mfu=0.62, attn_mfu=0.37, mbu=0.81, step_overhead_s=1.3e-4)
PREFILL = [(n, c) for n in (256, 1024, 4096, 16384, 32768) for c in (0, 4096, 32768, 131072)]
DECODE = [(b, c) for b in (1, 8, 64, 256) for c in (1024, 8192, 65536) if b * (c + 1) < 815_000]


def synthetic(profile=TRUE, noise=0.0, seed=0, link=None):
    """Measurements as the script writes them, from ``profile``'s cost model (x noise)."""
    rng = random.Random(seed)

    def jitter(t):
        return t * (1 + rng.uniform(-noise, noise))
    pre = [{"new_tokens": n, "context_tokens": c, "time_s": jitter(step_time_s(profile, [(n, c)]))}
           for n, c in PREFILL]
    dec = [{"batch": b, "context_tokens": c,
            "time_s": jitter(step_time_s(profile, [], [c] * b))} for b, c in DECODE]
    return pre, dec


def link_points(bw=(52e9, 47e9), lat=(9e-6, 12e-6), block=2 ** 21):
    pts = []
    for d, b, la in zip(cal.DIRECTIONS, bw, lat):
        for size in (2 ** 15, 2 ** 21, 2 ** 28):
            pts.append({"direction": d, "pattern": "single", "bytes": size, "copies": 1,
                        "time_s": la + size / b, "gb_s": size / (la + size / b) / 1e9})
        for n in (16, 64, 256):  # block copies reach 60 % of the link
            t = 2 * la + n * block / (0.6 * b)
            pts.append({"direction": d, "pattern": "blocks", "bytes": block, "copies": n,
                        "time_s": t, "gb_s": n * block / t / 1e9})
    return pts


def document(pre, dec, link=None, profile="h200-llama3-8b"):
    base = PROFILES[profile]
    m = base.model
    doc = {"format": cal.FORMAT, "complete": True, "profile": profile,
           "model": {"name": m.name, "layers": m.layers, "hidden": m.hidden,
                     "kv_heads": m.kv_heads, "head_dim": m.head_dim},
           "device": {"type": "cuda", "name": "synthetic H200", "torch": "2.11.0+cu130"},
           "created_utc": "2026-01-01T00:00:00+00:00",
           "measurements": {"prefill": pre, "decode": dec,
                            "link": {"points": link or [], "duplex": []}}}
    cal.fit_document(doc, base)
    return doc


def test_lstsq_solves_exact_and_overdetermined_systems_and_refuses_collinear():
    assert cal.lstsq([[2, 0], [0, 4]], [2, 8]) == pytest.approx([1, 2])
    rows = [[1, x, x * x] for x in range(6)]
    y = [3 - 2 * x + 0.5 * x * x for x in range(6)]
    assert cal.lstsq(rows, y) == pytest.approx([3, -2, 0.5])
    assert cal.lstsq([[1, 0], [1, 0]], [1, 1]) == pytest.approx([1, 0])  # zero column: 0
    with pytest.raises(ValueError, match="collinear"):
        cal.lstsq([[1, 2], [2, 4], [3, 6]], [1, 2, 3])
    with pytest.raises(ValueError, match="cannot determine"):
        cal.lstsq([[1, 2]], [1])


def test_fit_recovers_known_coefficients_from_synthetic_measurements():
    pre, dec = synthetic()
    fit = cal.fit_step_model(BASE, pre, dec)
    assert fit.mfu == pytest.approx(0.62, rel=1e-9)
    assert fit.attn_mfu == pytest.approx(0.37, rel=1e-9)
    assert fit.mbu == pytest.approx(0.81, rel=1e-9)
    assert fit.gpu_step_overhead_s == pytest.approx(1.3e-4, rel=1e-6)
    assert fit.warnings == []
    assert set(fit.regimes["prefill"]) == {cal.COMPUTE}
    assert set(fit.regimes["decode"]) == {cal.MEMORY}
    assert 2 <= fit.rounds <= cal.MAX_ROUNDS
    # a base profile far off (its bandwidth makes every point compute-bound; from its
    # regimes alone the alternation stalls there) still finds them: the second start
    off = cal.fit_step_model(BASE.with_(mfu=0.05, mbu=20.0), pre, dec)
    assert (off.mfu, off.attn_mfu, off.mbu) == pytest.approx((0.62, 0.37, 0.81), rel=1e-9)


def test_fit_with_noise_stays_close_and_the_error_report_is_model_vs_measured():
    pre, dec = synthetic(noise=0.03, seed=4)
    fit = cal.fit_step_model(BASE, pre, dec)
    assert fit.mfu == pytest.approx(0.62, rel=0.05)
    assert fit.attn_mfu == pytest.approx(0.37, rel=0.05)
    assert fit.mbu == pytest.approx(0.81, rel=0.05)
    prof = cal.fitted_profile(BASE, fit)
    rows = cal.error_rows(prof, pre, dec)
    assert len(rows["prefill"]) == len(pre) and len(rows["decode"]) == len(dec)
    for row, p in zip(rows["decode"], dec):
        model = step_time_s(prof, [], [p["context_tokens"]] * p["batch"])
        assert row["model_s"] == model and row["measured_s"] == p["time_s"]
        assert row["error_pct"] == pytest.approx(100 * (model - p["time_s"]) / p["time_s"])
    assert max(abs(r["error_pct"]) for r in rows["prefill"] + rows["decode"]) < 6


def test_error_rows_and_summary_by_hand():
    # measured twice the model: -50 %; half: +100 %
    t = step_time_s(TRUE, [(4096, 0)])
    rows = cal.error_rows(TRUE, [{"new_tokens": 4096, "context_tokens": 0, "time_s": 2 * t},
                                 {"new_tokens": 4096, "context_tokens": 0, "time_s": t / 2}], [])
    assert [r["error_pct"] for r in rows["prefill"]] == pytest.approx([-50.0, 100.0])
    s = cal.error_summary([{"error_pct": e} for e in (-4.0, 1.0, 3.0, -10.0)])
    assert s == {"points": 4, "median_abs_pct": 3.5, "max_abs_pct": 10.0}
    assert cal.error_summary([{"error_pct": -2.0}])["median_abs_pct"] == 2.0
    assert cal.error_summary([])["points"] == 0


def test_fit_keeps_what_the_points_do_not_determine_and_clamps_the_overhead():
    pre, _ = synthetic()
    fit = cal.fit_step_model(BASE, pre, [])
    assert fit.mbu == pytest.approx(BASE.mbu) and fit.mfu == pytest.approx(0.62, rel=1e-9)
    assert any("mbu kept" in w for w in fit.warnings)
    # times below the model's compute term: a negative intercept, fixed at 0
    flat = TRUE.with_(step_overhead_s=0.0)
    pre = [{**p, "time_s": step_time_s(flat, [(p["new_tokens"], p["context_tokens"])]) - 2e-5}
           for p in synthetic(flat)[0]]
    fit = cal.fit_step_model(BASE, pre, [])
    assert fit.gpu_step_overhead_s == 0.0
    assert any("overhead < 0" in w for w in fit.warnings)
    with pytest.raises(ValueError, match="time_s > 0"):
        cal.fit_step_model(BASE, [{"new_tokens": 1, "context_tokens": 0, "time_s": 0}], [])
    with pytest.raises(ValueError, match="one device"):
        cal.fit_step_model(get_profile("h100-llama3-70b-tp4"), pre, [])


def test_fit_link_recovers_bandwidth_and_latency():
    pts = link_points()
    fits, warnings = cal.fit_links(pts)
    assert warnings == []
    assert fits["single"]["d2h"]["bytes_s"] == pytest.approx(52e9, rel=1e-9)
    assert fits["single"]["h2d"]["latency_s"] == pytest.approx(12e-6, rel=1e-6)
    assert fits["blocks"]["d2h"]["bytes_s"] == pytest.approx(0.6 * 52e9, rel=1e-9)
    assert fits["blocks"]["d2h"]["latency_s"] == pytest.approx(18e-6, rel=1e-6)
    rows = cal.link_error_rows(pts, fits)
    assert len(rows) == len(pts) and max(abs(r["error_pct"]) for r in rows) < 1e-6
    one = cal.fit_link([{"bytes": 1000, "copies": 4, "time_s": 2e-6}])
    assert one == {"bytes_s": 2e9, "latency_s": 0.0}
    # a negative intercept is fixed at 0: bandwidth alone
    neg = cal.fit_link([{"bytes": b, "copies": 1, "time_s": b / 1e10 - 1e-6} for b in (1e5, 1e6)])
    assert neg["latency_s"] == 0.0 and 0 < neg["bytes_s"]
    fits, warnings = cal.fit_links([{"direction": "d2h", "pattern": "pieces", "bytes": b,
                                     "copies": 1, "time_s": 1e-3} for b in (1e3, 1e6)])
    assert fits == {} and "do not grow" in warnings[0]


def test_duplex_factors_compare_with_the_direction_alone():
    link = {"points": [{"pattern": "single", "bytes": 8, "copies": 1, "direction": "d2h",
                        "gb_s": 50.0}],
            "duplex": [{"pattern": "single", "bytes": 8, "copies": 1, "d2h_gb_s": 40.0,
                        "h2d_gb_s": 30.0}]}
    assert cal.duplex_factors(link) == [{"pattern": "single", "direction": "d2h",
                                         "factor": 0.8}]


def test_costmodel_splits_attention_when_the_profile_has_attn_mfu():
    n, c = 8192, 65536
    g, a = prefill_flops(TRUE.model, n, c)
    expect = g / (TRUE.peak_flops * 0.62) + a / (TRUE.peak_flops * 0.37)
    assert step_time_s(TRUE, [(n, c)]) == pytest.approx(expect + 1.3e-4, rel=1e-12)
    assert compute_time_s(BASE, g, a) == pytest.approx((g + a) / (BASE.peak_flops * 0.55))
    assert recompute_s(TRUE, c, n) == pytest.approx(expect, rel=1e-12)


def test_committed_profiles_say_they_are_derived():
    for p in PROFILES.values():
        assert p.source.startswith("derived: ") and not p.measured
    assert "datasheet" in PROFILES["h200-llama3-8b"].source


def test_profile_from_calibration_file(tmp_path):
    pre, dec = synthetic()
    doc = document(pre, dec, link_points())
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(doc))
    prof = HardwareProfile.from_calibration(str(path))
    assert prof.name == "h200-llama3-8b" and prof.measured
    assert prof.source.startswith(f"measured: {path} (synthetic H200, torch 2.11.0+cu130")
    assert (prof.mfu, prof.attn_mfu, prof.mbu) == pytest.approx((0.62, 0.37, 0.81), rel=1e-9)
    # GPU fixed time measured + the base profile's (derived) host-side overhead
    assert prof.step_overhead_s == pytest.approx(1.3e-4 + BASE.step_overhead_s, rel=1e-6)
    assert prof.host_d2h_bytes_s == pytest.approx(0.6 * 52e9, rel=1e-9)
    assert prof.host_h2d_bytes_s == pytest.approx(0.6 * 47e9, rel=1e-9)
    assert prof.host_link_latency_s == pytest.approx(24e-6, rel=1e-6)  # the larger of two
    assert prof.capacity_blocks == BASE.capacity_blocks and prof.peak_flops == BASE.peak_flops
    assert get_profile(str(path)) == prof
    single = HardwareProfile.from_calibration(str(path), host_overhead_s=0.0,
                                              link_pattern="single")
    assert single.step_overhead_s == pytest.approx(1.3e-4, rel=1e-6)
    assert single.host_d2h_bytes_s == pytest.approx(52e9, rel=1e-9)
    host = HostTierConfig.for_profile(prof, capacity_bytes=1e9)
    assert (host.d2h_bytes_s, host.latency_s) == (prof.host_d2h_bytes_s, prof.host_link_latency_s)
    assert HostTierConfig.for_profile(prof, d2h_bytes_s=5e9).d2h_bytes_s == 5e9
    assert HostTierConfig.for_profile(BASE) == HostTierConfig()


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.update(format="other/v1"), "not an anchorage-calibration/v1"),
    (lambda d: d.pop("fit"), "no 'fit'"),
    (lambda d: d["model"].update(layers=80), "is not h200-llama3-8b's"),
    (lambda d: d.update(profile="tpu"), "unknown profile 'tpu'"),
    (lambda d: d["fit"].update(mbu=-1), "fitted mbu must be > 0"),
])
def test_bad_calibration_files_are_refused_clearly(tmp_path, edit, msg):
    doc = document(*synthetic())
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=msg):
        HardwareProfile.from_calibration(str(path))


def test_unreadable_calibration_files(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        get_profile(str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        get_profile(str(tmp_path / "x.json"))
    with pytest.raises(ValueError, match="unknown hardware profile 'tpu'"):
        get_profile("tpu")
