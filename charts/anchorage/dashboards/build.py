"""Build Anchorage's Grafana dashboards (fleet, policy, router) as JSON.

The dashboards are code: this file is their source, the JSON beside it is generated and
committed (the chart ships it as ConfigMaps for the Grafana sidecar). Regenerate with

    .venv/bin/python charts/anchorage/dashboards/build.py

tests/chart/test_dashboards.py fails when the committed JSON differs from what this
builds, loads every dashboard with the Grafana model library, and runs every panel query
against a real Prometheus. Metric names: docs/metrics.md.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import common as gc
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat as gs
from grafana_foundation_sdk.builders import timeseries as gt
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

HERE = Path(__file__).resolve().parent
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label matchers of the dashboard variables.
M = 'namespace=~"$namespace",model_name=~"$model"'   # vLLM pods and their node agents
NS = 'namespace=~"$namespace"'                          # router (scraped in its namespace)
ACP = 'acp_namespace=~"$namespace"'                     # operator series, per policy
RI = "$__rate_interval"


@dataclass(frozen=True)
class Q:
    """One panel query: PromQL and its legend."""

    expr: str
    legend: str = ""


def _target(q: Q, ref: str) -> gp.Dataquery:
    t = gp.Dataquery().expr(q.expr).ref_id(ref).datasource(DS).range()
    if q.legend:
        t = t.legend_format(q.legend)
    return t


def timeseries(title: str, desc: str, queries: list[Q], unit: str = "short",
               w: int = 12, h: int = 8, lo: float | None = None,
               hi: float | None = None) -> gt.Panel:
    p = (gt.Panel().title(title).description(desc).datasource(DS).unit(unit)
         .span(w).height(h).line_width(1).fill_opacity(10)
         .legend(gc.VizLegendOptions().display_mode(LegendDisplayMode.LIST)
                 .placement(LegendPlacement.BOTTOM).show_legend(True))
         .tooltip(gc.VizTooltipOptions().mode(TooltipDisplayMode.MULTI)
                  .sort(SortOrder.DESCENDING)))
    if lo is not None:
        p = p.min(lo)
    if hi is not None:
        p = p.max(hi)
    for i, q in enumerate(queries):
        p = p.with_target(_target(q, chr(ord("A") + i)))
    return p


def stat(title: str, desc: str, q: Q, unit: str = "short", w: int = 6) -> gs.Panel:
    return (gs.Panel().title(title).description(desc).datasource(DS).unit(unit)
            .span(w).height(4).reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]))
            .with_target(_target(q, "A").instant()))


def _variables(d: gd.Dashboard, with_model: bool = True) -> gd.Dashboard:
    d = d.with_variable(gd.DatasourceVariable("datasource").label("Data source")
                        .type("prometheus"))
    d = d.with_variable(
        gd.QueryVariable("namespace").label("Namespace").datasource(DS)
        .query("label_values(vllm:num_requests_running, namespace)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).all_value(".*"))
    if with_model:
        d = d.with_variable(
            gd.QueryVariable("model").label("Model").datasource(DS)
            .query('label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))
    return d


def _base(uid: str, title: str, desc: str) -> gd.Dashboard:
    return (gd.Dashboard(title).uid(uid).description(desc).tags(["anchorage", "vllm"])
            .editable().tooltip(DashboardCursorSync.CROSSHAIR).refresh("30s")
            .time("now-3h", "now").timezone("browser"))


def _hit_ratio(by: str) -> str:
    return (f"sum by ({by}) (rate(vllm:prefix_cache_hits_total{{{M}}}[{RI}]))\n  /\n"
            f"(sum by ({by}) (rate(vllm:prefix_cache_queries_total{{{M}}}[{RI}])) > 0)")


def _quantile(qv: float, metric: str, match: str, by: str = "le") -> str:
    return f"histogram_quantile({qv}, sum by ({by}) (rate({metric}_bucket{{{match}}}[{RI}])))"


def fleet() -> gd.Dashboard:
    d = _variables(_base("anchorage-fleet", "Anchorage / Fleet",
                         "Prefix-cache efficiency, latency and capacity of the vLLM fleet."))
    d = d.with_row(gd.Row("Now"))
    d = d.with_panel(stat("Fleet hit rate", "Prefix-cache hit rate of the selected models (5 m).",
                          Q(f"sum(rate(vllm:prefix_cache_hits_total{{{M}}}[5m])) / sum(rate(vllm:prefix_cache_queries_total{{{M}}}[5m]))"),
                          unit="percentunit"))
    d = d.with_panel(stat("Target hit rate", "spec.autoscaling.targetHitRate of the AgentCachePolicies.",
                          Q(f"max(anchorage_operator_target_hit_rate_ratio{{{ACP}}})"), unit="percentunit"))
    d = d.with_panel(stat("Replicas", "vLLM replicas reporting metrics.",
                          Q(f"count(vllm:num_requests_running{{{M}}})")))
    d = d.with_panel(stat("TTFT p90", "90th percentile time to first token, fleet-wide.",
                          Q(_quantile(0.9, "vllm:time_to_first_token_seconds", M)), unit="s"))
    d = d.with_row(gd.Row("Cache efficiency"))
    d = d.with_panel(timeseries(
        "Hit rate: fleet vs target",
        "Token-weighted prefix-cache hit rate per model (recorded, 5 m) against the "
        "AgentCachePolicy target.",
        [Q(f"anchorage:fleet_prefix_cache_hit_ratio:rate5m{{{M}}}", "{{model_name}} fleet"),
         Q(f"anchorage_operator_target_hit_rate_ratio{{{ACP}}}", "{{acp}} target")],
        unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Hit rate per replica", "vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total per pod.",
        [Q(_hit_ratio("pod"), "{{pod}}")], unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Recomputed prefill tokens", "Prompt tokens per second that missed the cache and were "
        "prefilled again (queries - hits), and all prompt tokens.",
        [Q(f"sum by (model_name) (rate(vllm:prefix_cache_queries_total{{{M}}}[{RI}]))\n  -\n"
           f"sum by (model_name) (rate(vllm:prefix_cache_hits_total{{{M}}}[{RI}]))",
           "{{model_name}} recomputed"),
         Q(f"sum by (model_name) (rate(vllm:prompt_tokens_total{{{M}}}[{RI}]))",
           "{{model_name}} prompt")], unit="short", lo=0))
    d = d.with_panel(timeseries(
        "Evictions of soon-reused blocks", "Blocks evicted then requested again within the "
        "policy horizon: capacity pressure (the operator scales out on it).",
        [Q(f"sum by (pod) (rate(anchorage_evictions_reused_total{{{M}}}[{RI}]))", "{{pod}}")],
        unit="short", lo=0))
    d = d.with_row(gd.Row("Latency and load"))
    d = d.with_panel(timeseries(
        "Time to first token", "TTFT p50 / p90 / p99 per model.",
        [Q(_quantile(0.5, "vllm:time_to_first_token_seconds", M, "le, model_name"), "{{model_name}} p50"),
         Q(_quantile(0.9, "vllm:time_to_first_token_seconds", M, "le, model_name"), "{{model_name}} p90"),
         Q(_quantile(0.99, "vllm:time_to_first_token_seconds", M, "le, model_name"), "{{model_name}} p99")],
        unit="s", lo=0))
    d = d.with_panel(timeseries(
        "Queue depth", "Requests waiting and running per pod.",
        [Q(f"sum by (pod) (vllm:num_requests_waiting{{{M}}})", "{{pod}} waiting"),
         Q(f"sum by (pod) (vllm:num_requests_running{{{M}}})", "{{pod}} running")], lo=0))
    d = d.with_panel(timeseries(
        "KV cache usage", "Fraction of KV blocks in use per pod.",
        [Q(f"max by (pod) (vllm:kv_cache_usage_perc{{{M}}})", "{{pod}}")],
        unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Replicas: desired vs actual", "The operator's desired replicas, the target's replicas, "
        "and the pods reporting metrics.",
        [Q(f"sum by (acp) (anchorage_operator_desired_replicas{{{ACP}}})", "{{acp}} desired"),
         Q(f"sum by (acp) (anchorage_operator_replicas{{{ACP}}})", "{{acp}} actual"),
         Q(f"count by (model_name) (vllm:num_requests_running{{{M}}})", "{{model_name}} scraped")],
        lo=0))
    d = d.with_panel(timeseries(
        "Scale events", "Scale actions by the operator, by direction.",
        [Q(f"sum by (acp, direction) (increase(anchorage_operator_scale_events_total{{{ACP}}}[{RI}]))",
           "{{acp}} {{direction}}")], lo=0, w=24))
    return d


def policy() -> gd.Dashboard:
    d = _variables(_base("anchorage-policy", "Anchorage / Policy",
                         "What the eviction policy inside each engine learns and does."))
    d = d.with_row(gd.Row("Policy state"))
    d = d.with_panel(timeseries(
        "Engines by policy and mode", "anchorage_policy_info: `active` = the policy orders "
        "eviction; `stock` = vLLM unchanged (policy off, or unsupported engine).",
        [Q(f"sum by (policy, mode) (anchorage_policy_info{{{M}}})", "{{policy}} {{mode}}")], lo=0))
    d = d.with_panel(timeseries(
        "Predictability R", "Predictability of agent transitions (the prefetch gate's input).",
        [Q(f"max by (pod) (anchorage_predictability_ratio{{{M}}})", "{{pod}}")],
        unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Next-agent prediction accuracy", "Correct / (correct + wrong) next-agent predictions, "
        "and the share of requests with no prediction.",
        [Q(f"sum by (model_name) (rate(anchorage_next_agent_predictions_total{{{M},outcome=\"correct\"}}[{RI}]))\n  /\n"
           f"(sum by (model_name) (rate(anchorage_next_agent_predictions_total{{{M},outcome=~\"correct|wrong\"}}[{RI}])) > 0)",
           "{{model_name}} accuracy"),
         Q(f"sum by (model_name) (rate(anchorage_next_agent_predictions_total{{{M},outcome=\"none\"}}[{RI}]))\n  /\n"
           f"(sum by (model_name) (rate(anchorage_next_agent_predictions_total{{{M}}}[{RI}])) > 0)",
           "{{model_name}} no prediction")], unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Protected blocks", "Free cached blocks the policy protects, by kind (anchor, session).",
        [Q(f"sum by (kind) (anchorage_protected_blocks{{{M}}})", "{{kind}}")], lo=0))
    d = d.with_row(gd.Row("Warm-ups and evictions"))
    d = d.with_panel(timeseries(
        "Warm-ups by outcome", "Warm-up requests per second: issued, used before eviction, "
        "wasted, skipped, failed.",
        [Q(f"sum by (outcome) (rate(anchorage_warmups_total{{{M}}}[{RI}]))", "{{outcome}}")], lo=0))
    d = d.with_panel(timeseries(
        "Wasted warm-ups", "Wasted / (used + wasted) over 30 minutes (recorded); alert above 50 %.",
        [Q(f"anchorage:warmup_wasted_ratio:rate30m{{{M}}}", "{{model_name}}")],
        unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Evictions by reason", "Blocks evicted per second by why they were the victim.",
        [Q(f"sum by (reason) (rate(anchorage_evictions_total{{{M}}}[{RI}]))", "{{reason}}")], lo=0))
    d = d.with_panel(timeseries(
        "Policy errors and fall-backs", "Exceptions inside the policy (each decision fell back "
        "to LRU) and victims taken in stock recency order by a policy other than lru (it had "
        "none left, or it failed).",
        [Q(f"sum by (pod, policy) (rate(anchorage_policy_errors_total{{{M}}}[{RI}]))", "{{pod}} errors"),
         Q(f"sum by (pod) (rate(anchorage_evictions_total{{{M},policy!=\"lru\",reason=\"lru\"}}[{RI}]))",
           "{{pod}} stock-order victims")], lo=0))
    d = d.with_row(gd.Row("Tiering (ANCHORAGE_TIERING, docs/tiering.md)"))
    d = d.with_panel(timeseries(
        "Reserved blocks per agent", "GPU blocks reserved for critical agents by spatial "
        "tiering (empty while tiering is off).",
        [Q(f"sum by (agent) (anchorage_tiering_reserved_blocks{{{M}}})", "{{agent}}")], lo=0))
    d = d.with_panel(timeseries(
        "Offloads and reloads", "Offload gate decisions (and the actions of "
        "rejected stalls) and reloads by outcome per second; only with ANCHORAGE_TIERING="
        "temporal (on the CPU build a reload recomputes: it has no host tier).",
        [Q(f"sum by (decision) (rate(anchorage_tiering_offloads_total{{{M}}}[{RI}]))",
           "offload {{decision}}"),
         Q(f"sum by (outcome) (rate(anchorage_tiering_reloads_total{{{M}}}[{RI}]))",
           "reload {{outcome}}")], lo=0))
    d = d.with_panel(timeseries(
        "KV bytes moved to and from host", "d2h: offloads, h2d: reloads, estimated as "
        "blocks x bytes per block (only with ANCHORAGE_TIERING=temporal).",
        [Q(f"sum by (direction) (rate(anchorage_tiering_bytes_total{{{M}}}[{RI}]))",
           "{{direction}}")], unit="Bps", lo=0))
    d = d.with_row(gd.Row("Host tier (KV connector, docs/tiering.md)"))
    d = d.with_panel(timeseries(
        "Prompt tokens from host memory", "Share of prompt tokens vLLM's offloading "
        "connector loaded from host memory, by host-tier policy (empty without Anchorage's "
        "connector).",
        [Q(f"sum by (model_name, policy) (rate(anchorage_host_tier_hits_total{{{M},unit=\"tokens\"}}[{RI}]))"
           f"\n  / on (model_name) group_left ()\n(sum by (model_name) (rate(vllm:prompt_tokens_total{{{M}}}[{RI}])) > 0)",
           "{{model_name}} {{policy}}")], unit="percentunit", lo=0, hi=1, w=8))
    d = d.with_panel(timeseries(
        "Host reloads, stores and fallbacks", "Reloads from host memory by outcome "
        "(in_time: a just-in-time warm-up was first; late: the request waited for its "
        "load), loads copied in their request's step (sync), store transfers, tool stalls by "
        "gate decision and failed transfers that were recomputed, per second.",
        [Q(f"sum by (outcome) (rate(anchorage_host_tier_loads_total{{{M}}}[{RI}]))",
           "load {{outcome}}"),
         Q(f"sum(rate(anchorage_host_tier_sync_loads_total{{{M}}}[{RI}]))", "sync loads"),
         Q(f"sum(rate(anchorage_host_tier_stores_total{{{M}}}[{RI}]))", "stores"),
         Q(f"sum by (decision) (rate(anchorage_host_tier_stalls_total{{{M}}}[{RI}]))",
           "stall {{decision}}"),
         Q(f"sum by (reason) (rate(anchorage_host_tier_fallbacks_total{{{M}}}[{RI}]))",
           "fallback {{reason}}")], lo=0, w=8))
    d = d.with_panel(timeseries(
        "Host tier bytes", "KV bytes copied each way per second (d2h: stores, h2d: "
        "loads).",
        [Q(f"sum by (direction) (rate(anchorage_host_tier_bytes_total{{{M}}}[{RI}]))",
           "{{direction}} bytes/s")], unit="Bps", lo=0, w=8))
    d = d.with_panel(timeseries(
        "Host occupancy", "Host-memory chunks in use over the tier's capacity "
        "(cpu_bytes_to_use).",
        [Q(f"sum by (pod) (anchorage_host_tier_used_chunks{{{M}}})\n  /\n"
           f"(sum by (pod) (anchorage_host_tier_capacity_chunks{{{M}}}) > 0)", "{{pod}}")],
        unit="percentunit", lo=0, hi=1, w=18))
    d = d.with_panel(stat("Host tier capacity", "Host memory the selected engines' host "
                          "tiers may use (cpu_bytes_to_use).",
                          Q(f"sum(anchorage_host_tier_capacity_bytes{{{M}}})"), unit="bytes"))
    d = d.with_panel(timeseries(
        "Node pool", "With hostTier.nodePool: chunks loaded from another engine's host tier "
        "on the node (peer_hit), not stored because a peer held them (deduplicated), loads "
        "that failed because the peer's chunk changed (stale, recomputed), per second; and "
        "the peers each engine reads (empty without the node pool).",
        [Q(f"sum by (kind) (rate(anchorage_host_tier_node_pool_chunks_total{{{M}}}[{RI}]))",
           "{{kind}}"),
         Q(f"max by (pod) (anchorage_host_tier_node_pool_peers{{{M}}})", "peers {{pod}}")],
        lo=0, w=18))
    d = d.with_row(gd.Row("Overhead and configuration"))
    d = d.with_panel(timeseries(
        "Decision latency", "Time to choose eviction victims for one allocation (sampled).",
        [Q(_quantile(0.5, "anchorage_policy_decision_seconds", M, "le, policy"), "{{policy}} p50"),
         Q(_quantile(0.99, "anchorage_policy_decision_seconds", M, "le, policy"), "{{policy}} p99")],
        unit="s", lo=0))
    d = d.with_panel(timeseries(
        "Config generation", "Generation of the operator's ConfigMap each node agent runs.",
        [Q(f"max by (pod) (anchorage_config_generation{{{M}}})", "{{pod}}")], lo=0))
    d = d.with_panel(timeseries(
        "Config versions refused", "Versions of the operator's config each engine refused "
        "(invalid, empty or truncated, parameters the policy rejects): the previous "
        "generation stays in force; alert AnchorageConfigRejected.",
        [Q(f"sum by (pod) (increase(anchorage_config_rejected_total{{{M}}}[{RI}]))", "{{pod}}")],
        lo=0))
    d = d.with_panel(timeseries(
        "Access log sampling", "Records per second written to the sampled access log the "
        "operator's tuning replays.",
        [Q(f"sum by (pod) (rate(anchorage_access_log_records_total{{{M}}}[{RI}]))", "{{pod}}")], lo=0))
    d = d.with_panel(timeseries(
        "Tuning runs", "Digital-twin tuning runs by result (adopted, rejected, error).",
        [Q(f"sum by (acp, result) (increase(anchorage_operator_tuning_runs_total{{{ACP}}}[{RI}]))",
           "{{acp}} {{result}}")], lo=0))
    d = d.with_panel(timeseries(
        "Operator: time since last reconcile", "Seconds since each AgentCachePolicy was last "
        "reconciled; alert after 10 minutes.",
        [Q(f"time() - max by (acp) (anchorage_operator_last_reconcile_timestamp_seconds{{{ACP}}})",
           "{{acp}}")], unit="s", lo=0))
    return d


def router() -> gd.Dashboard:
    d = _variables(_base("anchorage-router", "Anchorage / Router",
                         "Placement decisions of the Anchorage router and how well they hit the cache."),
                   with_model=False)
    d = d.with_row(gd.Row("Traffic"))
    d = d.with_panel(timeseries(
        "Requests by policy and outcome", "Requests per second routed to replicas.",
        [Q(f"sum by (policy, outcome) (rate(anchorage_router_requests_total{{{NS}}}[{RI}]))",
           "{{policy}} {{outcome}}")], lo=0))
    d = d.with_panel(timeseries(
        "Requests by replica", "Requests per second sent to each replica, and requests in flight.",
        [Q(f"sum by (replica) (rate(anchorage_router_requests_total{{{NS}}}[{RI}]))", "{{replica}}"),
         Q(f"sum by (replica) (anchorage_router_replica_inflight{{{NS}}})", "{{replica}} in flight")],
        lo=0))
    d = d.with_panel(timeseries(
        "Queued prefill tokens per replica", "The router's estimate of the prompt tokens each "
        "replica still has to prefill (sent, no first byte yet, less the predicted cache hits): "
        "the load signal the routing policies see.",
        [Q(f"sum by (replica) (anchorage_router_replica_queued_tokens{{{NS}}})", "{{replica}}")],
        lo=0))
    d = d.with_panel(timeseries(
        "Rejected (429) and errors", "Requests the router refused (429 when every replica is "
        "saturated, 4xx from its own checks) by reason, and upstream failures per second.",
        [Q(f"sum by (reason) (rate(anchorage_router_rejected_total{{{NS}}}[{RI}]))", "rejected {{reason}}"),
         Q(f"sum(rate(anchorage_router_requests_total{{{NS},outcome!~\"ok|rejected|cancelled\"}}[{RI}]))", "upstream not ok")],
        lo=0))
    d = d.with_panel(timeseries(
        "Decision latency", "Time to pick a replica, p50 / p99.",
        [Q(_quantile(0.5, "anchorage_router_decision_seconds", NS), "p50"),
         Q(_quantile(0.99, "anchorage_router_decision_seconds", NS), "p99")],
        unit="s", lo=0))
    d = d.with_row(gd.Row("Cache hits"))
    d = d.with_panel(timeseries(
        "Predicted vs observed cached tokens", "Share of prompt tokens the router predicted "
        "cached at decision time vs the share replicas reported cached.",
        [Q(f"sum(rate(anchorage_router_predicted_cached_tokens_total{{{NS}}}[{RI}]))\n  /\n"
           f"(sum(rate(anchorage_router_prompt_tokens_total{{{NS}}}[{RI}])) > 0)", "predicted"),
         Q(f"sum(rate(anchorage_router_observed_cached_tokens_total{{{NS}}}[{RI}]))\n  /\n"
           f"(sum(rate(anchorage_router_prompt_tokens_total{{{NS}}}[{RI}])) > 0)", "observed"),
         Q(f"anchorage:router_observed_cached_ratio:rate5m{{{NS}}}", "observed (5 m)")],
        unit="percentunit", lo=0, hi=1))
    d = d.with_panel(timeseries(
        "Observed cached share per replica", "Cached / prompt tokens per replica.",
        [Q(f"sum by (replica) (rate(anchorage_router_observed_cached_tokens_total{{{NS}}}[{RI}]))\n  /\n"
           f"(sum by (replica) (rate(anchorage_router_prompt_tokens_total{{{NS}}}[{RI}])) > 0)",
           "{{replica}}")], unit="percentunit", lo=0, hi=1))
    d = d.with_row(gd.Row("Upstream health"))
    d = d.with_panel(timeseries(
        "Retries", "Attempts retried on another replica before the first byte, by reason.",
        [Q(f"sum by (reason) (rate(anchorage_router_retries_total{{{NS}}}[{RI}]))", "{{reason}}")],
        lo=0))
    d = d.with_panel(timeseries(
        "Replicas and ejections", "Replicas in rotation, replicas ejected, and ejections.",
        [Q(f"sum(anchorage_router_replica_healthy{{{NS}}})", "healthy"),
         Q(f"count(anchorage_router_replica_healthy{{{NS}}} == 0) or vector(0)", "ejected"),
         Q(f"sum(increase(anchorage_router_ejections_total{{{NS}}}[{RI}]))", "ejections")], lo=0))
    d = d.with_row(gd.Row("Shared state between router replicas"))
    d = d.with_panel(timeseries(
        "Peer decision staleness", "Age of another replica's (or router pod's) decision when "
        "this one applied it, p50 / p99: how far behind the shared session and prefix state runs.",
        [Q(_quantile(0.5, "anchorage_router_peer_staleness_seconds", NS), "p50"),
         Q(_quantile(0.99, "anchorage_router_peer_staleness_seconds", NS), "p99")],
        unit="s", lo=0))
    d = d.with_panel(timeseries(
        "Peer decisions, lost batches and sync errors", "Peer decisions applied per second, "
        "batches dropped before they were read, failed exchanges with the shared state.",
        [Q(f"sum(rate(anchorage_router_peer_decisions_total{{{NS}}}[{RI}]))", "applied"),
         Q(f"sum(rate(anchorage_router_peer_batches_lost_total{{{NS}}}[{RI}]))", "batches lost"),
         Q(f"sum(rate(anchorage_router_peer_sync_errors_total{{{NS}}}[{RI}]))", "sync errors")],
        lo=0))
    return d


DASHBOARDS = {"fleet": fleet, "policy": policy, "router": router}


def render(name: str) -> str:
    """The dashboard's JSON text, as committed (stable key order, trailing newline)."""
    data = json.loads(json.dumps(DASHBOARDS[name]().build(), cls=JSONEncoder))
    for i, panel in enumerate(data["panels"], start=1):
        panel["id"] = i   # stable, unique panel ids (links and Grafana's panel state use them)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    for name in DASHBOARDS:
        (out / f"{name}.json").write_text(render(name))
        print(f"wrote {out / f'{name}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
