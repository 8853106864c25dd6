"""Shared helpers for the operator's tests against the real API server (polling, objects)."""

from __future__ import annotations

import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "manifests" / "crd"
G, V, P = "anchorage.dev", "v1alpha1", "agentcachepolicies"


def poll(fn, what: str, timeout_s: float = 90.0, every_s: float = 0.5):
    """Call ``fn`` until it returns something truthy; fail with its last result or error."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as e:  # noqa: BLE001  (report the last error if it never settles)
            last = e
        else:
            if last:
                return last
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def deployment(name: str, namespace: str, replicas: int) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "vllm",
                                                           "image": "vllm/vllm-openai"}]}}}}


# -- the operator as the chart runs it: its ServiceAccount, RBAC and arguments -------------

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def chart_operator_objects(namespace: str, values: dict | None = None) -> list[dict]:
    """The chart's operator objects (``helm template`` offline): ServiceAccount, RBAC,
    Deployment, peering object..., for an operator release in ``namespace``."""
    from tests.chart.conftest import objects, render
    from tests.conftest import need_module

    need_module("helm_python", "helm-python-sdk (pip install helm-python-sdk)")
    # (the CRD upgrade hook and the users' roles are not the operator's: left out)
    base = {"fullnameOverride": "anchorage", "models": [], "router": {"enabled": False},
            "crds": {"upgradeJob": {"enabled": False}}, "rbac": {"aggregatedRoles": False},
            "dashboards": {"enabled": False}, "networkPolicy": {"enabled": False},
            "monitoring": {"serviceMonitors": False, "prometheusRule": False}}
    return objects(render({**base, **(values or {})}, namespace=namespace))


def apply_objects(api, objs: list[dict], kinds: tuple[str, ...] = RBAC_KINDS) -> list[dict]:
    """Create the objects of ``kinds`` (as the admin); returns them."""
    from kubernetes import utils

    chosen = [o for o in objs if o["kind"] in kinds]
    for o in chosen:
        utils.create_from_dict(api, o)
    return chosen


class OperatorProcess:
    """``anchorage operator`` with the chart's container arguments (ports on loopback),
    authenticated by ``kubeconfig`` (the chart's ServiceAccount token)."""

    def __init__(self, deployment: dict, kubeconfig: Path, workdir: Path, *,
                 interval_s: float = 1.0, priority: int = 1000,
                 access_log_dir: Path | None = None):
        import os
        import sys

        from tests.support.procs import free_port, spawn

        self.kubeconfig = kubeconfig
        self.metrics_port, self.health_port = free_port(), free_port()
        args = []
        for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"]:
            if a.startswith("--liveness="):
                a = f"--liveness=http://127.0.0.1:{self.health_port}/healthz"
            elif a.startswith("--metrics-port="):
                a = f"--metrics-port={self.metrics_port}"
            elif a.startswith("--metrics-host="):
                a = "--metrics-host=127.0.0.1"
            elif a.startswith("--peering-lifetime-s="):
                a = "--peering-lifetime-s=5"
            args.append(a)
        self.args = args + ["--interval-s", str(interval_s), "--priority", str(priority)]
        if access_log_dir is not None:    # the files a policy's tuning.accessLogs may name
            self.args += ["--access-log-dir", str(access_log_dir)]
        self.log = workdir / "operator.log"
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1",
                   POD_ID="operator-sa")
        self.proc = spawn([sys.executable, "-m", "anchorage", *self.args], self.log, env=env)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def metric_total(self, name: str, **labels: str) -> float:
        """The sum of the operator's /metrics samples ``name`` with these labels."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
        return sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def forbidden(self) -> list[str]:
        """Log lines of requests the API server refused (403)."""
        return [ln for ln in self.output().splitlines()
                if "403" in ln and ("Forbidden" in ln or "forbidden" in ln)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        from tests.support.procs import stop

        stop(self.proc)
