"""What the Prometheus Operator would configure from the chart's monitors, for a plain
Prometheus: the test cluster serves ``monitoring.coreos.com/v1`` (minimal CRDs, so the
chart's ``auto`` monitors render), and a real Prometheus (Debian's 2.42, on the node)
scrapes through scrape configs generated from the ServiceMonitor/PodMonitor objects the chart
created (selectors, port names, paths, intervals) and loads its PrometheusRule groups. A
monitor that selects the wrong pods or ports scrapes nothing, and the test sees it.

Translation (the subset of the Prometheus Operator's generator the chart uses):
PodMonitor -> ``kubernetes_sd`` role ``pod``, keep the selector's labels and the container
port named ``port``; ServiceMonitor -> role ``endpoints``, keep the Service's labels and the
endpoint port named ``port``; target labels ``namespace``, ``pod``, ``container``,
``service``, ``endpoint``, ``job``. ``scrapeProtocols: [PrometheusText0.0.4]`` needs
Prometheus >= 2.49, which this machine lacks: 2.42 negotiates OpenMetrics, where
prometheus_client writes ``vllm:x`` as ``vllm_x``; a metric relabelling restores the names
the text format keeps.
"""

from __future__ import annotations

import re

CRDS = [("servicemonitors", "ServiceMonitor"), ("podmonitors", "PodMonitor"),
        ("prometheusrules", "PrometheusRule")]


def crd(plural: str, kind: str) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                               "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object",
                                       "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _label(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _sd(role: str, namespaces: list[str], sd_auth: dict) -> list[dict]:
    return [{"role": role, "namespaces": {"names": namespaces}, **sd_auth}]


def _common(mon: dict, ep: dict, kind: str, i: int) -> dict:
    ns = mon["metadata"]["namespace"]
    job = f"{kind.lower()}/{ns}/{mon['metadata']['name']}/{i}"
    cfg = {"job_name": job, "metrics_path": ep.get("path", "/metrics"),
           "honor_labels": bool(ep.get("honorLabels", False))}
    if ep.get("interval"):
        cfg["scrape_interval"] = ep["interval"]
    protocols = mon["spec"].get("scrapeProtocols") or []
    if protocols and protocols[0] == "PrometheusText0.0.4":
        cfg["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": "vllm_(.+)",
                                          "target_label": "__name__", "replacement": "vllm:$1"}]
    return cfg


def pod_monitor(mon: dict, sd_auth: dict) -> list[dict]:
    ns_sel = mon["spec"].get("namespaceSelector", {}).get("matchNames") or [mon["metadata"]["namespace"]]
    sel = mon["spec"].get("selector", {}).get("matchLabels", {})
    out = []
    for i, ep in enumerate(mon["spec"].get("podMetricsEndpoints", [])):
        cfg = _common(mon, ep, "podMonitor", i)
        relabel = [{"source_labels": [f"__meta_kubernetes_pod_label_{_label(k)}"], "regex": v,
                    "action": "keep"} for k, v in sel.items()]
        relabel += [
            {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
             "action": "drop"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"],
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"target_label": "job", "replacement": f"{mon['metadata']['namespace']}/{mon['metadata']['name']}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]
        cfg["kubernetes_sd_configs"] = _sd("pod", ns_sel, sd_auth)
        cfg["relabel_configs"] = relabel
        out.append(cfg)
    return out


def service_monitor(mon: dict, sd_auth: dict) -> list[dict]:
    ns_sel = mon["spec"].get("namespaceSelector", {}).get("matchNames") or [mon["metadata"]["namespace"]]
    sel = mon["spec"].get("selector", {}).get("matchLabels", {})
    out = []
    for i, ep in enumerate(mon["spec"].get("endpoints", [])):
        cfg = _common(mon, ep, "serviceMonitor", i)
        relabel = [{"source_labels": [f"__meta_kubernetes_service_label_{_label(k)}"], "regex": v,
                    "action": "keep"} for k, v in sel.items()]
        relabel += [
            {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"],
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": ep["port"]},
        ]
        cfg["kubernetes_sd_configs"] = _sd("endpoints", ns_sel, sd_auth)
        cfg["relabel_configs"] = relabel
        out.append(cfg)
    return out


def prometheus_config(monitors: dict[str, list[dict]], sd_auth: dict, rule_files: list[str],
                      interval: str = "5s") -> dict:
    scrape = []
    for m in monitors.get("PodMonitor", []):
        scrape += pod_monitor(m, sd_auth)
    for m in monitors.get("ServiceMonitor", []):
        scrape += service_monitor(m, sd_auth)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": rule_files, "scrape_configs": scrape}


def rule_groups(rules: list[dict]) -> dict:
    return {"groups": [g for r in rules for g in r["spec"].get("groups", [])]}
