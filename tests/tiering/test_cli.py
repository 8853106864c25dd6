"""`anchorage sim --mode timed --tiering ...`: the flags, the --json fields, bad input."""

import json

import pytest

from anchorage.cli import main
from anchorage.trace.format import write_trace
from anchorage.trace.generate import generate


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    header, recs = generate("selector", 4, 16, 2, mean_requests=6, max_context_tokens=12000)
    path = tmp_path_factory.mktemp("tier") / "t.jsonl"
    write_trace(path, recs, header)
    return str(path)


BASE = ["sim", "--mode", "timed", "--capacity-blocks", "500", "--policies", "hybrid",
        "--router", "session", "--time-scale", "0.001", "--no-progress", "--json"]


def test_tiering_fields_extend_the_json(trace, capsys):
    assert main(BASE + ["--trace", trace]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["tiering"] == "off" and "bytes_moved" not in plain["results"][0]
    assert main(BASE + ["--trace", trace, "--tiering", "naive", "--agent-hints",
                        "--host-tier-gb", "50", "--host-bw-gbs", "12.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    r = out["results"][0]
    assert out["tiering"] == "naive"
    # every existing field is still there
    assert set(plain["results"][0]) - {"per_replica"} <= set(r)
    assert r["bytes_moved"] == r["offload_bytes"] + r["reload_bytes"] > 0
    assert r["tiering"]["host_capacity_bytes"] == 50e9
    assert r["tiering"]["h2d_bytes_s"] == 12.5e9
    assert r["host_hit_rate"] > 0


@pytest.mark.parametrize("extra, msg", [
    (["--tiering", "naive", "--router", "pooled"], "pooled"),
    (["--tiering", "naive", "--host-bw-gbs", "0"], "bandwidths"),
    (["--tiering", "tokencake", "--offload-watermark", "2"], "watermark"),
])
def test_bad_options_give_a_clear_error(trace, capsys, extra, msg):
    assert main(BASE + ["--trace", trace] + extra) != 0
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_tiering_needs_timed_mode(trace, capsys):
    assert main(["sim", "--trace", trace, "--capacity-blocks", "100", "--tiering",
                 "naive"]) != 0
    assert "--mode timed" in capsys.readouterr().err
