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

Discovery: Debian builds Prometheus without the Kubernetes service discovery, so the test
stands in for it: ``discover`` lists the pods and Endpoints from the API server and writes
the targets with the ``__meta_kubernetes_*`` labels the ``pod`` and ``endpoints`` roles give
(file_sd, refreshed every few seconds); the relabelling that selects and names targets is
the one the Prometheus Operator would generate, unchanged.
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


def _sd(role: str, namespaces: list[str], sd_dir: str) -> list[dict]:
    return [{"files": [f"{sd_dir}/{role}-{ns}.json" for ns in namespaces], "refresh_interval": "3s"}]


def _labels(prefix: str, labels: dict | None) -> dict[str, str]:
    return {f"{prefix}{_label(k)}": v for k, v in (labels or {}).items()}


def pod_targets(pods) -> list[dict]:
    """kubernetes_sd role ``pod``: one target per container port of each pod with an IP."""
    out = []
    for p in pods:
        if not p.status.pod_ip:
            continue
        ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        base = {"__meta_kubernetes_namespace": p.metadata.namespace,
                "__meta_kubernetes_pod_name": p.metadata.name,
                "__meta_kubernetes_pod_phase": p.status.phase or "",
                "__meta_kubernetes_pod_ready": str(ready).lower(),
                **_labels("__meta_kubernetes_pod_label_", p.metadata.labels)}
        for c in p.spec.containers:
            for port in c.ports or []:
                out.append({"targets": [f"{p.status.pod_ip}:{port.container_port}"], "labels": {
                    **base, "__meta_kubernetes_pod_container_name": c.name,
                    "__meta_kubernetes_pod_container_port_name": port.name or "",
                    "__meta_kubernetes_pod_container_port_number": str(port.container_port)}})
    return out


def endpoint_targets(endpoints, services, pods) -> list[dict]:
    """kubernetes_sd role ``endpoints``: one target per address and port of each Endpoints
    object, with its Service's labels and the pod and container behind the address."""
    svc = {s.metadata.name: s for s in services}
    by_name = {p.metadata.name: p for p in pods}
    out = []
    for ep in endpoints:
        s = svc.get(ep.metadata.name)
        base = {"__meta_kubernetes_namespace": ep.metadata.namespace,
                "__meta_kubernetes_service_name": ep.metadata.name,
                **_labels("__meta_kubernetes_service_label_", s.metadata.labels if s else None)}
        for sub in ep.subsets or []:
            addrs = [(a, "true") for a in sub.addresses or []] + \
                    [(a, "false") for a in sub.not_ready_addresses or []]
            for addr, ready in addrs:
                ref = addr.target_ref.name if addr.target_ref and addr.target_ref.kind == "Pod" else None
                pod = by_name.get(ref) if ref else None
                for port in sub.ports or []:
                    labels = {**base, "__meta_kubernetes_endpoint_port_name": port.name or "",
                              "__meta_kubernetes_endpoint_ready": ready}
                    if pod is not None:
                        labels["__meta_kubernetes_pod_name"] = pod.metadata.name
                        for c in pod.spec.containers:
                            if any(cp.container_port == port.port for cp in c.ports or []):
                                labels["__meta_kubernetes_pod_container_name"] = c.name
                    out.append({"targets": [f"{addr.ip}:{port.port}"], "labels": labels})
    return out


def discover(api, namespaces: list[str], sd_dir) -> None:
    """Write the ``pod`` and ``endpoints`` target files of ``namespaces`` (atomically)."""
    import json
    import os

    from kubernetes import client

    core = client.CoreV1Api(api)
    for ns in namespaces:
        pods = core.list_namespaced_pod(ns).items
        files = {"pod": pod_targets(pods),
                 "endpoints": endpoint_targets(core.list_namespaced_endpoints(ns).items,
                                               core.list_namespaced_service(ns).items, pods)}
        for role, targets in files.items():
            tmp = f"{sd_dir}/.{role}-{ns}.json"
            with open(tmp, "w") as f:
                json.dump(targets, f)
            os.replace(tmp, f"{sd_dir}/{role}-{ns}.json")


def namespaces(monitors: dict[str, list[dict]]) -> list[str]:
    out = set()
    for m in monitors.get("PodMonitor", []) + monitors.get("ServiceMonitor", []):
        out.update(m["spec"].get("namespaceSelector", {}).get("matchNames") or [m["metadata"]["namespace"]])
    return sorted(out)


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


def pod_monitor(mon: dict, sd_dir: str) -> list[dict]:
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
        cfg["file_sd_configs"] = _sd("pod", ns_sel, sd_dir)
        cfg["relabel_configs"] = relabel
        out.append(cfg)
    return out


def service_monitor(mon: dict, sd_dir: str) -> list[dict]:
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
        cfg["file_sd_configs"] = _sd("endpoints", ns_sel, sd_dir)
        cfg["relabel_configs"] = relabel
        out.append(cfg)
    return out


def prometheus_config(monitors: dict[str, list[dict]], sd_dir: str, rule_files: list[str],
                      interval: str = "5s") -> dict:
    scrape = []
    for m in monitors.get("PodMonitor", []):
        scrape += pod_monitor(m, sd_dir)
    for m in monitors.get("ServiceMonitor", []):
        scrape += service_monitor(m, sd_dir)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": rule_files, "scrape_configs": scrape}


def rule_groups(rules: list[dict]) -> dict:
    return {"groups": [g for r in rules for g in r["spec"].get("groups", [])]}
