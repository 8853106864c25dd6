"""Fast checks of the end-to-end test's Prometheus wiring (tests/cluster/monitors.py), no
cluster needed: the scrape configs generated from the chart's own monitors (rendered with
the CPU values and the monitoring API present) are a configuration Debian's Prometheus
accepts (`promtool check config`), and the discovery stand-in gives each target the
`__meta_kubernetes_*` labels those configs select on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
import pytest

pytest.importorskip("kubernetes")
from kubernetes.client import (CoreV1EndpointPort, V1Container, V1ContainerPort,  # noqa: E402
                               V1EndpointAddress, V1Endpoints, V1EndpointSubset, V1ObjectMeta,
                               V1ObjectReference, V1Pod, V1PodCondition, V1PodSpec, V1PodStatus,
                               V1Service)

from tests.chart.conftest import MONITORING_APIS, objects, render  # noqa: E402
from tests.cluster import monitors  # noqa: E402
from tests.cluster.conftest import CPU_VALUES  # noqa: E402
from tests.conftest import need  # noqa: E402

PROMTOOL = Path("/usr/bin/promtool")


def _monitors() -> dict[str, list[dict]]:
    docs = objects(render(yaml.safe_load(CPU_VALUES.read_text()),
                          api_versions=MONITORING_APIS))
    return {kind: [d for d in docs if d["kind"] == kind] for _, kind in monitors.CRDS}


def test_generated_config_is_valid_for_this_prometheus(tmp_path):
    need(PROMTOOL.exists(), "promtool (apt prometheus)", "scripts/setup.d/40-prometheus.sh")
    objs = _monitors()
    assert objs["PodMonitor"] and objs["ServiceMonitor"], objs
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(monitors.rule_groups(objs["PrometheusRule"])))
    cfg = monitors.prometheus_config(objs, str(tmp_path), [str(tmp_path / "rules.yml")])
    assert all("file_sd_configs" in c and c["relabel_configs"] for c in cfg["scrape_configs"])
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([str(PROMTOOL), "check", "config", str(tmp_path / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def _pod(name: str, ip: str, ready: bool) -> V1Pod:
    return V1Pod(
        metadata=V1ObjectMeta(name=name, namespace="llm", labels={"app.kubernetes.io/component": "model"}),
        status=V1PodStatus(pod_ip=ip, phase="Running",
                           conditions=[V1PodCondition(type="Ready", status=str(ready))]),
        spec=V1PodSpec(containers=[
            V1Container(name="vllm", ports=[V1ContainerPort(container_port=8000, name="http")]),
            V1Container(name="node-agent", ports=[V1ContainerPort(container_port=9400, name="agent")])]))


def test_discovery_labels_match_the_roles(tmp_path):
    pods = [_pod("a", "10.98.0.2", True), _pod("b", "10.98.0.3", False),
            V1Pod(metadata=V1ObjectMeta(name="pending", namespace="llm"), status=V1PodStatus(),
                  spec=V1PodSpec(containers=[V1Container(name="x")]))]
    pt = monitors.pod_targets(pods)
    assert sorted(t["targets"][0] for t in pt) == ["10.98.0.2:8000", "10.98.0.2:9400",
                                                   "10.98.0.3:8000", "10.98.0.3:9400"]
    agent = next(t["labels"] for t in pt if t["targets"] == ["10.98.0.3:9400"])
    assert agent["__meta_kubernetes_pod_container_name"] == "node-agent"
    assert agent["__meta_kubernetes_pod_container_port_name"] == "agent"
    assert agent["__meta_kubernetes_pod_ready"] == "false"
    assert agent["__meta_kubernetes_pod_label_app_kubernetes_io_component"] == "model"

    ep = V1Endpoints(metadata=V1ObjectMeta(name="svc", namespace="llm"), subsets=[V1EndpointSubset(
        addresses=[V1EndpointAddress(ip="10.98.0.2", target_ref=V1ObjectReference(kind="Pod", name="a"))],
        not_ready_addresses=[V1EndpointAddress(ip="10.98.0.3", target_ref=V1ObjectReference(kind="Pod", name="b"))],
        ports=[CoreV1EndpointPort(port=9400, name="agent")])])
    svc = V1Service(metadata=V1ObjectMeta(name="svc", namespace="llm", labels={"app": "x"}))
    et = monitors.endpoint_targets([ep], [svc], pods)
    assert [(t["targets"][0], t["labels"]["__meta_kubernetes_endpoint_ready"]) for t in et] == \
        [("10.98.0.2:9400", "true"), ("10.98.0.3:9400", "false")]
    assert all(t["labels"]["__meta_kubernetes_pod_container_name"] == "node-agent"
               and t["labels"]["__meta_kubernetes_service_label_app"] == "x" for t in et)
    json.dumps(pt + et)   # what discover() writes
