"""Prometheus I/O: the windowed fleet signals of one model, over the HTTP query API.

Series (``sel`` is ``spec.metrics.selector``, ``w`` the window):

    hits     sum(rate({__name__=~"<hit names>", sel}[w]))
    queries  sum(rate({__name__=~"<query names>", sel}[w]))
    waiting  sum(avg_over_time({__name__=~"<waiting names>", sel}[w]))
    kv       avg(avg_over_time({__name__=~"<kv names>", sel}[w]))
    soon     sum(rate({__name__=~"anchorage_evictions_reused_total|
                                   anchorage_evictions_reused_soon_total", sel}[w]))

with the vLLM names and the Ray Serve LLM variants (``ray_vllm:``/``ray_vllm_`` prefixes).
Any transport error, non-success answer or non-numeric sample raises ``MetricsError``.
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from anchorage.autoscale.signals import FleetSignals, MetricsError

# Evicted blocks requested again soon after. The contract (docs/metrics.md, issue 4's
# "evictions by reason") and the node agent's exporter name is the first; the second is an
# early name some exporters used, still read for compatibility.
EVICTIONS_REUSED = "anchorage_evictions_reused_total"
EVICTIONS_REUSED_LEGACY = "anchorage_evictions_reused_soon_total"
EVICTIONS_REUSED_SOON = f"{EVICTIONS_REUSED}|{EVICTIONS_REUSED_LEGACY}"


def _names(*bases: str) -> str:
    out = []
    for b in bases:
        out += [f"vllm:{b}", f"ray_vllm:{b}", f"ray_vllm_{b}"]
    return "|".join(out)


HITS = _names("prefix_cache_hits_total", "gpu_prefix_cache_hits_total")
QUERIES = _names("prefix_cache_queries_total", "gpu_prefix_cache_queries_total")
WAITING = _names("num_requests_waiting")
KV_USAGE = _names("kv_cache_usage_perc", "gpu_cache_usage_perc")


def _sel(names: str, selector: str) -> str:
    s = f'__name__=~"{names}"'
    return "{" + s + (f",{selector}" if selector.strip() else "") + "}"


def fleet_queries(selector: str, window_s: int) -> dict[str, str]:
    w = f"{int(window_s)}s"
    return {
        "hits": f"sum(rate({_sel(HITS, selector)}[{w}]))",
        "queries": f"sum(rate({_sel(QUERIES, selector)}[{w}]))",
        "waiting": f"sum(avg_over_time({_sel(WAITING, selector)}[{w}]))",
        "kv": f"avg(avg_over_time({_sel(KV_USAGE, selector)}[{w}]))",
        "soon": f"sum(rate({_sel(EVICTIONS_REUSED_SOON, selector)}[{w}]))",
    }


class PrometheusClient:
    def __init__(self, url: str, *, timeout_s: float = 5.0,
                 transport: httpx.BaseTransport | None = None):
        self.url = url.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def query_scalar(self, expr: str) -> float | None:
        """Value of an instant query returning at most one sample; None when empty."""
        try:
            resp = self._http.get(f"{self.url}/api/v1/query", params={"query": expr})
        except httpx.HTTPError as e:
            raise MetricsError(f"Prometheus at {self.url} unreachable: {e}") from None
        try:
            body: Any = resp.json()
        except ValueError:
            raise MetricsError(f"Prometheus at {self.url} answered HTTP {resp.status_code} "
                               "with a body that is not JSON") from None
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise MetricsError(f"Prometheus query failed (HTTP {resp.status_code}): "
                               f"{err or 'unexpected answer'}: {expr}")
        data = body.get("data") or {}
        result = data.get("result")
        if data.get("resultType") != "vector" or not isinstance(result, list):
            raise MetricsError(f"Prometheus returned {data.get('resultType')!r}, expected a vector")
        if not result:
            return None
        if len(result) > 1:
            raise MetricsError(f"expected one sample, got {len(result)}: {expr}")
        try:
            v = float(result[0]["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise MetricsError(f"malformed sample in Prometheus answer: {result[0]!r}") from None
        if math.isnan(v) or math.isinf(v):
            raise MetricsError(f"Prometheus returned {v} for: {expr}")
        return v

    def fleet_signals(self, *, selector: str, window_s: int, replicas: int,
                      block_size: int = 16) -> FleetSignals:
        q = fleet_queries(selector, window_s)
        v = {k: self.query_scalar(expr) for k, expr in q.items()}
        return FleetSignals.from_rates(
            hits_per_s=v["hits"], queries_per_s=v["queries"], waiting_total=v["waiting"],
            replicas=replicas, kv_usage=v["kv"], reused_soon_evictions_per_s=v["soon"],
            block_size=block_size)
