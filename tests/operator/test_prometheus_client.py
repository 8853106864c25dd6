"""The Prometheus adapter against a real Prometheus scraping vLLM-shaped exporters."""

from __future__ import annotations

import time

import httpx
import pytest

from anchorage.autoscale.signals import MetricsError
from anchorage.operator.prometheus import PrometheusClient


def _settled(client: PrometheusClient, pred, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = client.fleet_signals(selector='job="vllm"', window_s=5, replicas=2)
            if pred(last):
                return last
        except MetricsError as e:
            last = e
        time.sleep(0.5)
    raise AssertionError(f"signals never matched; last: {last}")


def test_fleet_signals_from_real_prometheus(prometheus, exporters):
    for e in exporters:
        e.set(hit_rate=0.25, queries_per_s=1000, waiting=3, kv=0.5, soon_evictions_per_s=5)
    c = PrometheusClient(prometheus.url)
    # 2 exporters x 5 blocks/s x 16 tokens / 2000 queried tokens/s = 0.08: both names are
    # summed (one exporter emits anchorage_evictions_reused_total, the other the legacy
    # _soon_ name). Every signal is waited for: each rate needs a 5 s window of samples
    # taken after set(), and on a loaded machine the two exporters' windows fill at
    # different scrapes (the eviction rate was seen at 0.066 while hits had settled).
    s = _settled(c, lambda s: s.hit_rate is not None and abs(s.hit_rate - 0.25) < 0.02
                 and abs(s.queue_depth - 3.0) < 0.01
                 and s.capacity_miss_rate is not None
                 and abs(s.capacity_miss_rate - 0.08) < 0.01)
    assert s.kv_usage == pytest.approx(0.5, abs=0.01)
    assert s.capacity_miss_rate == pytest.approx(0.08, abs=0.01)
    c.close()


def test_unreachable_and_nonsense_answers_raise_metrics_error():
    with pytest.raises(MetricsError, match="unreachable"):
        PrometheusClient("http://127.0.0.1:1", timeout_s=1).query_scalar("up")

    def answer(body, status=200):
        return httpx.MockTransport(lambda req: httpx.Response(status, json=body))

    cases = [
        ({"status": "error", "error": "parse error"}, 400, "parse error"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, 200, "matrix"),
        ({"status": "success", "data": {"resultType": "vector",
                                        "result": [{"value": [0, "NaN"]}]}}, 200, "(?i)nan"),
        ({"status": "success", "data": {"resultType": "vector",
                                        "result": [{"value": [0]}]}}, 200, "malformed"),
    ]
    for body, status, match in cases:
        c = PrometheusClient("http://127.0.0.1:9", transport=answer(body, status))
        with pytest.raises(MetricsError, match=match):
            c.query_scalar("x")
    bad = httpx.MockTransport(lambda req: httpx.Response(200, text="<html>"))
    with pytest.raises(MetricsError, match="not JSON"):
        PrometheusClient("http://127.0.0.1:9", transport=bad).query_scalar("x")
