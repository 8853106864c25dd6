"""The node agent's Prometheus series (docs/metrics.md, "Emitted by the node agent").

One collector renders every ``anchorage_*`` series from plain state at scrape time: the
plugin's counters come from its latest snapshot (they are the engine process's totals, so
the sidecar mirrors them instead of keeping its own copies); warm-ups, the access log and
premature evictions are counted by the sidecar. Every series carries ``model_name``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from anchorage.node_agent.snapshot import DecisionHistogram, Tiering

WARMUP_OUTCOMES = ("issued", "used", "wasted", "skipped", "failed")
PREDICTION_OUTCOMES = ("correct", "wrong", "none")


@dataclass
class MetricsView:
    """Everything a scrape shows, as plain data (built by the sidecar)."""

    model_name: str
    policy: str = "off"
    mode: str = "stock"
    config_generation: int = 0
    config_rejected: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    evictions_reused: int = 0
    protected_blocks: dict[str, int] = field(default_factory=lambda: {"anchor": 0, "session": 0})
    predictions: dict[str, int] = field(default_factory=dict)
    predictability: float = 0.0
    warmups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WARMUP_OUTCOMES, 0))
    policy_errors: int = 0
    decision_seconds: DecisionHistogram | None = None
    access_log_records: int = 0
    tiering: Tiering | None = None  # the snapshot's (node_agent/snapshot.py); None: off
    host_tier: dict[str, Any] | None = None  # the host tier's (node_agent/offload); None: off


class NodeAgentCollector(Collector):
    def __init__(self, view: Callable[[], MetricsView]):
        self.view = view

    def collect(self):
        v = self.view()
        m = v.model_name
        g = GaugeMetricFamily("anchorage_policy_info", "Policy configured in this engine "
                              "(always 1).", labels=["model_name", "policy", "mode"])
        g.add_metric([m, v.policy, v.mode], 1.0)
        yield g
        g = GaugeMetricFamily("anchorage_config_generation", "Generation of the operator's "
                              "config in force (0 before any).", labels=["model_name"])
        g.add_metric([m], float(v.config_generation))
        yield g
        c = CounterMetricFamily("anchorage_config_rejected", "Versions of the operator's "
                                "config refused (the previous one stays in force).",
                                labels=["model_name"])
        c.add_metric([m], float(v.config_rejected))
        yield c
        c = CounterMetricFamily("anchorage_evictions", "Cached blocks evicted, by reason.",
                                labels=["model_name", "policy", "reason"])
        for reason, n in sorted(v.evictions.items()):
            c.add_metric([m, v.policy, reason], float(n))
        yield c
        c = CounterMetricFamily("anchorage_evictions_reused", "Evicted blocks stored again "
                                "within the horizon (premature evictions).",
                                labels=["model_name", "policy"])
        c.add_metric([m, v.policy], float(v.evictions_reused))
        yield c
        g = GaugeMetricFamily("anchorage_protected_blocks", "Free cached blocks the policy "
                              "protects.", labels=["model_name", "kind"])
        for kind in ("anchor", "session"):
            g.add_metric([m, kind], float(v.protected_blocks.get(kind, 0)))
        yield g
        c = CounterMetricFamily("anchorage_next_agent_predictions", "Next-agent predictions "
                                "checked against the agent that came.",
                                labels=["model_name", "outcome"])
        for o in PREDICTION_OUTCOMES:
            c.add_metric([m, o], float(v.predictions.get(o, 0)))
        yield c
        g = GaugeMetricFamily("anchorage_predictability_ratio", "Predictability R of agent "
                              "transitions.", labels=["model_name"])
        g.add_metric([m], float(v.predictability))
        yield g
        c = CounterMetricFamily("anchorage_warmups", "Warm-up requests by outcome.",
                                labels=["model_name", "outcome"])
        for o in WARMUP_OUTCOMES:
            c.add_metric([m, o], float(v.warmups.get(o, 0)))
        yield c
        c = CounterMetricFamily("anchorage_policy_errors", "Exceptions inside the policy "
                                "(stock LRU for that decision).", labels=["model_name", "policy"])
        c.add_metric([m, v.policy], float(v.policy_errors))
        yield c
        h = HistogramMetricFamily("anchorage_policy_decision_seconds", "Time to choose "
                                  "eviction victims for one allocation (sampled).",
                                  labels=["model_name", "policy"])
        d = v.decision_seconds
        if d is not None and d.le and len(d.counts) == len(d.le):
            buckets = [("+Inf" if le == "+Inf" else repr(float(le)), float(n))
                       for le, n in zip(d.le, d.counts)]
            h.add_metric([m, v.policy], buckets, float(d.sum))
        else:
            h.add_metric([m, v.policy], [("+Inf", 0.0)], 0.0)
        yield h
        c = CounterMetricFamily("anchorage_access_log_records", "Records written to the "
                                "sampled access log.", labels=["model_name"])
        c.add_metric([m], float(v.access_log_records))
        yield c
        yield from tiering_families(m, v.tiering)
        yield from host_tier_families(m, v.host_tier)


TIERING_COUNTERS = (  # (snapshot key, metric, label, help): only from an engine that offloads
    ("offloads", "anchorage_tiering_offloads", "decision",
     "Offload gate decisions at tool stalls."),
    ("reloads", "anchorage_tiering_reloads", "outcome", "Reloads from host memory by outcome."),
    ("bytes", "anchorage_tiering_bytes", "direction",
     "KV bytes moved (d2h: offload, h2d: reload)."),
)


def tiering_families(m: str, t: Tiering | None):
    """``anchorage_tiering_*`` (docs/tiering.md): nothing while tiering is off; the reserved
    blocks per agent when it is on; the offload/reload/bytes counters only when the engine
    reports them (it does temporal tiering: not on the CPU build), never as made-up zeros."""
    if t is None:
        return
    g = GaugeMetricFamily("anchorage_tiering_reserved_blocks", "GPU blocks reserved for a "
                          "critical agent (spatial tiering).", labels=["model_name", "agent"])
    for agent, n in sorted((t.reserved_blocks or {}).items()):
        g.add_metric([m, agent], float(n))
    yield g
    for key, name, label, doc in TIERING_COUNTERS:
        counts = getattr(t, key)
        if counts is not None:
            c = CounterMetricFamily(name, doc, labels=["model_name", label])
            for k, n in sorted(counts.items()):
                c.add_metric([m, k], float(n))
            yield c


HOST_TIER_COUNTERS = (  # (snapshot key, metric, label, help)
    ("hits", "anchorage_host_tier_hits", "unit",
     "Prompt tokens and blocks served from host memory (loads at admission and warm-ups)."),
    ("loads", "anchorage_host_tier_loads", "outcome",
     "Reloads from host memory: in_time (a warm-up brought the prefix before its request), "
     "late (the request waited for its load), wasted (a warm-up the request did not use)."),
    ("bytes", "anchorage_host_tier_bytes", "direction",
     "KV bytes copied (d2h: stores to host memory, h2d: loads)."),
    ("fallbacks", "anchorage_host_tier_fallbacks", "reason",
     "Host transfers that failed and were recomputed: store_failed, load_failed, timeout."),
    ("gate", "anchorage_host_tier_stalls", "decision",
     "Tool stalls planned by the temporal controller, by gate decision."),
)


def host_tier_families(m: str, h: dict[str, Any] | None):
    """``anchorage_host_tier_*`` (docs/metrics.md): only from an engine whose KV connector
    is Anchorage's (``node_agent/offload``), never as made-up zeros."""
    if h is None:
        return
    for key, name, label, doc in HOST_TIER_COUNTERS:
        c = CounterMetricFamily(name, doc, labels=["model_name", "policy", label])
        for k, n in sorted(h[key].items()):
            c.add_metric([m, h["policy"], k], float(n))
        yield c
    c = CounterMetricFamily("anchorage_host_tier_stores", "Store transfers to host memory.",
                            labels=["model_name", "policy"])
    c.add_metric([m, h["policy"]], float(h["stores"]))
    yield c
    c = CounterMetricFamily("anchorage_host_tier_sync_loads", "Loads from host memory "
                            "copied in the step that schedules their request "
                            "(sync_load_max_ms).", labels=["model_name", "policy"])
    c.add_metric([m, h["policy"]], float(h.get("sync_loads", 0)))
    yield c
    g = GaugeMetricFamily("anchorage_host_tier_used_chunks", "Host-memory chunks holding KV.",
                          labels=["model_name", "policy"])
    g.add_metric([m, h["policy"]], float(h["used_chunks"]))
    yield g
    g = GaugeMetricFamily("anchorage_host_tier_capacity_chunks", "Host-memory chunks the "
                          "tier may use (cpu_bytes_to_use).", labels=["model_name", "policy"])
    g.add_metric([m, h["policy"]], float(h["capacity_chunks"]))
    yield g
    g = GaugeMetricFamily("anchorage_host_tier_capacity_bytes", "Host memory the tier may "
                          "use, bytes.", labels=["model_name", "policy"])
    g.add_metric([m, h["policy"]], float(h["capacity_bytes"]))
    yield g
    pool = h.get("node_pool")
    if pool is None:
        return
    c = CounterMetricFamily(
        "anchorage_host_tier_node_pool_chunks", "Node pool chunks: peer_hit (loaded from "
        "another engine's host tier), deduplicated (not stored: a peer held it), stale (a "
        "peer's chunk changed during its load: recomputed).",
        labels=["model_name", "policy", "kind"])
    for kind, key in (("peer_hit", "peer_hits"), ("deduplicated", "deduplicated"),
                      ("stale", "stale_loads")):
        c.add_metric([m, h["policy"], kind], float(pool[key]))
    yield c
    g = GaugeMetricFamily("anchorage_host_tier_node_pool_peers", "Engines on this node whose "
                          "host tiers this engine reads.", labels=["model_name", "policy"])
    g.add_metric([m, h["policy"]], float(pool["peers"]))
    yield g


def make_registry(view: Callable[[], MetricsView]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(NodeAgentCollector(view))
    return reg
