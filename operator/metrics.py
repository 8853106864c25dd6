"""The operator's own Prometheus series (docs/metrics.md, "Emitted by the operator").

``acp_namespace``/``acp`` label the AgentCachePolicy. Served by ``serve(port)`` on
``/metrics`` (``anchorage operator --metrics-port``, default 8080; 0 disables).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry()
_L = ["acp_namespace", "acp"]
RECONCILES = Counter("anchorage_operator_reconciles", "Reconciliations.", _L + ["result"],
                     registry=REGISTRY)
LAST_RECONCILE = Gauge("anchorage_operator_last_reconcile_timestamp_seconds",
                       "Unix time of the last successful reconciliation.", _L, registry=REGISTRY)
REPLICAS = Gauge("anchorage_operator_replicas", "Replicas of the target workload.", _L,
                 registry=REGISTRY)
DESIRED = Gauge("anchorage_operator_desired_replicas", "Replicas the decision wants.", _L,
                registry=REGISTRY)
SCALE_EVENTS = Counter("anchorage_operator_scale_events", "Scale actions taken.",
                       _L + ["direction"], registry=REGISTRY)
HIT_RATE = Gauge("anchorage_operator_hit_rate_ratio", "Windowed fleet prefix-cache hit rate.",
                 _L, registry=REGISTRY)
TARGET_HIT_RATE = Gauge("anchorage_operator_target_hit_rate_ratio",
                        "spec.autoscaling.targetHitRate.", _L, registry=REGISTRY)
METRICS_AVAILABLE = Gauge("anchorage_operator_metrics_available",
                          "1 when the last Prometheus query succeeded.", _L, registry=REGISTRY)
TUNING_RUNS = Counter("anchorage_operator_tuning_runs", "Tuning (digital twin) runs.",
                      _L + ["result"], registry=REGISTRY)


def record(namespace: str, name: str, spec: dict[str, Any], status: dict[str, Any],
           facts: dict[str, Any]) -> None:
    lab = (namespace, name)
    RECONCILES.labels(*lab, "ok").inc()
    LAST_RECONCILE.labels(*lab).set(time.time())
    if "observed_replicas" in facts:
        REPLICAS.labels(*lab).set(facts["observed_replicas"])
    if status.get("desiredReplicas") is not None:
        DESIRED.labels(*lab).set(status["desiredReplicas"])
    if facts.get("scaled"):
        SCALE_EVENTS.labels(*lab, facts["scaled"]).inc()
    if status.get("hitRate") is not None:
        HIT_RATE.labels(*lab).set(status["hitRate"])
    TARGET_HIT_RATE.labels(*lab).set((spec.get("autoscaling") or {}).get("targetHitRate", 0.5))
    if "metrics_ok" in facts:
        METRICS_AVAILABLE.labels(*lab).set(1 if facts["metrics_ok"] else 0)
    if facts.get("tuning"):
        TUNING_RUNS.labels(*lab, facts["tuning"]).inc()


def record_error(namespace: str, name: str) -> None:
    RECONCILES.labels(namespace, name, "error").inc()


def serve(port: int, addr: str = "127.0.0.1") -> None:
    start_http_server(port, addr=addr, registry=REGISTRY)
