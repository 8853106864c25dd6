"""Loopback exporters emitting every series docs/metrics.md documents, for checking the
dashboards and rules against a real Prometheus.

The series are read from the tables of docs/metrics.md (name, type, labels, emitter), so
the exporters emit exactly the documented names and labels: a dashboard query that uses an
undocumented name or label returns nothing and its test fails. Counters advance at fixed
rates, integrated at scrape time (no background thread); label values come from
LABEL_VALUES, one series per value.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.support.prometheus import serve_text_format

DOC = REPO / "docs" / "metrics.md"

# Label values the exporters use (several values = several series).
LABEL_VALUES: dict[str, list[str]] = {
    "model_name": ["llama-8b"],
    "policy": ["hybrid"],
    "mode": ["active"],
    "reason": ["lru", "low_survival", "far_reuse", "session_done", "warmup_unused", "fallback"],
    "kind": ["anchor", "session"],
    "replica": ["llama-8b-0", "llama-8b-1"],
    "state": ["healthy", "ejected"],
    "acp_namespace": ["llm"],
    "acp": ["llama-8b"],
    "direction": ["up", "down"],
    "result": ["ok", "error"],
}
# Per-metric label values where the generic ones do not fit.
METRIC_LABEL_VALUES: dict[tuple[str, str], list[str]] = {
    ("anchorage_next_agent_predictions_total", "outcome"): ["correct", "wrong", "none"],
    ("anchorage_warmups_total", "outcome"): ["issued", "used", "wasted", "skipped", "failed"],
    ("anchorage_router_requests_total", "outcome"): ["ok", "error", "timeout"],
    ("anchorage_router_requests_total", "policy"): ["agent"],
    ("anchorage_router_rejected_total", "reason"): ["saturated", "too_large"],
    ("anchorage_router_retries_total", "reason"): ["connect", "5xx"],
    ("anchorage_operator_tuning_runs_total", "result"): ["adopted", "rejected", "error"],
    ("anchorage_tiering_reserved_blocks", "agent"): ["planner", "coder"],
    ("anchorage_tiering_offloads_total", "decision"): ["ok", "low_pressure"],
    ("anchorage_tiering_reloads_total", "outcome"): ["in_time", "late", "wasted"],
    ("anchorage_tiering_bytes_total", "direction"): ["d2h", "h2d"],
    ("anchorage_host_tier_hits_total", "unit"): ["tokens", "blocks"],
    ("anchorage_host_tier_loads_total", "outcome"): ["in_time", "late", "wasted"],
    ("anchorage_host_tier_bytes_total", "direction"): ["d2h", "h2d"],
    ("anchorage_host_tier_fallbacks_total", "reason"): ["store_failed", "load_failed",
                                                        "timeout"],
    ("anchorage_host_tier_stalls_total", "decision"): ["ok", "low_pressure"],
    ("anchorage_host_tier_hits_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_loads_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_bytes_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_fallbacks_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_stalls_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_stores_total", "policy"): ["anchorage"],
    ("anchorage_host_tier_used_chunks", "policy"): ["anchorage"],
    ("anchorage_host_tier_capacity_chunks", "policy"): ["anchorage"],
    ("anchorage_host_tier_capacity_bytes", "policy"): ["anchorage"],
}
# Counter rates (per second, per series) that give the dashboards meaningful ratios; the
# fleet hit rate is (600 + 300) / (1000 + 1000) = 0.45 with the two model pods below.
COUNTER_RATES: dict[str, float] = {
    "vllm:prefix_cache_queries_total": 1000.0,
    "vllm:prompt_tokens_total": 1000.0,
    "anchorage_router_prompt_tokens_total": 500.0,
    "anchorage_router_observed_cached_tokens_total": 200.0,
    "anchorage_router_predicted_cached_tokens_total": 250.0,
}
HIST_BUCKETS = (0.001, 0.01, 0.1, 1.0)
HIST_FRACTIONS = (0.1, 0.5, 0.9, 1.0)
HIST_RATE = 10.0


@dataclass(frozen=True)
class Series:
    """One documented metric: name (with _total for counters), type, labels, emitter."""

    name: str
    type: str      # counter | gauge | histogram
    labels: tuple[str, ...]
    emitter: str   # node-agent | router | operator | vllm


def documented(doc: Path = DOC) -> list[Series]:
    """The metric tables of docs/metrics.md (vLLM's rows carry model_name)."""
    out = []
    for line in doc.read_text().splitlines():
        m = re.match(r"\|\s*`((?:anchorage_|vllm:)[a-z_:]+)`\s*\|\s*([a-z]+)", line)
        if not m:
            continue
        name, kind = m.group(1), m.group(2)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if name.startswith("vllm:"):
            out.append(Series(name, kind, ("model_name",), "vllm"))
            continue
        labels = tuple(re.findall(r"`([a-z_]+)`", cells[2]))
        em = re.search(r"emitted by ([a-z-]+)", cells[-1])
        assert em, f"docs/metrics.md: {name} does not say which component emits it"
        out.append(Series(name, kind, labels, em.group(1)))
    return out


def _label_sets(s: Series) -> list[dict[str, str]]:
    sets: list[dict[str, str]] = [{}]
    for label in s.labels:
        values = METRIC_LABEL_VALUES.get((s.name, label)) or LABEL_VALUES.get(label)
        assert values, f"tests/chart/exporters.py: no test values for label {label!r} of {s.name}"
        sets = [{**ls, label: v} for ls in sets for v in values]
    return sets


class DocumentedExporter:
    """A prometheus_client collector serving the documented series of some emitters.

    ``pods`` maps pod name -> prefix-cache hit rate: the series are emitted once per pod
    with `namespace` and `pod` labels (scrape with honor_labels), so all pods' samples
    share scrape timestamps and rates over them are exactly comparable."""

    def __init__(self, emitters: set[str], *, pods: dict[str, float] | None = None,
                 namespace: str = "llm"):
        from prometheus_client import CollectorRegistry

        self.series = [s for s in documented() if s.emitter in emitters]
        self.pods = pods or {}
        self.namespace = namespace
        self.t0 = time.monotonic() - 60.0   # counters start as if 60 s had passed
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self._server = serve_text_format(self.registry)
        self.port = self._server.server_address[1]

    def _counter_rate(self, s: Series, i: int, hit_rate: float) -> float:
        if s.name == "vllm:prefix_cache_hits_total":
            return COUNTER_RATES["vllm:prefix_cache_queries_total"] * hit_rate
        return COUNTER_RATES.get(s.name, 1.0 + i)

    def _gauge(self, s: Series, i: int, pod_index: int) -> float:
        if s.name.endswith("_timestamp_seconds"):
            return time.time()
        if s.name == "anchorage_router_replica_healthy":
            return 1.0 if i == 0 else 0.0   # one replica in rotation, one ejected
        if s.name.endswith("_ratio") or s.name.endswith("_perc"):
            return 0.25 + 0.5 * (i % 2)
        if s.name.endswith("_info") or s.name.endswith("_available"):
            return 1.0
        return 2.0 + i + pod_index

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        elapsed = time.monotonic() - self.t0
        pods = list(self.pods.items()) or [(None, 0.5)]
        for s in self.series:
            keys = list(s.labels) + (["namespace", "pod"] if self.pods else [])
            if s.type == "counter":
                fam = CounterMetricFamily(s.name.removesuffix("_total"), s.name, labels=keys)
            elif s.type == "gauge":
                fam = GaugeMetricFamily(s.name, s.name, labels=keys)
            elif s.type == "histogram":
                fam = HistogramMetricFamily(s.name, s.name, labels=keys)
            else:
                raise AssertionError(f"docs/metrics.md: unknown type {s.type!r} of {s.name}")
            for p, (pod, hit_rate) in enumerate(pods):
                extra = [self.namespace, pod] if self.pods else []
                for i, ls in enumerate(_label_sets(s)):
                    values = [ls[k] for k in s.labels] + extra
                    if s.type == "counter":
                        fam.add_metric(values, self._counter_rate(s, i, hit_rate) * elapsed)
                    elif s.type == "gauge":
                        fam.add_metric(values, self._gauge(s, i, p))
                    else:
                        n = HIST_RATE * elapsed
                        buckets = [(str(b), f * n) for b, f in zip(HIST_BUCKETS, HIST_FRACTIONS)]
                        buckets.append(("+Inf", n))
                        fam.add_metric(values, buckets, sum_value=0.05 * n)
            yield fam

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
