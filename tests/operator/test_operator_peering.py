"""One active operator among several replicas (kopf peering), on the real kube-apiserver.

Two ``anchorage operator`` processes watch one namespace through the namespaced
``KopfPeering`` named ``ha``, with distinct priorities (kopf pauses *every* operator that
shares a priority) and a short peering lifetime (4 s), so a standby takes over soon after
the active replica dies without saying goodbye (SIGKILL: its keep-alive simply expires).

What is observed, not timed: each process's own ``anchorage_operator_reconciles_total``
(its /metrics on loopback) and the ConfigMap the active one writes. The low-priority replica
works while alone; once the high-priority one runs it pauses and stays idle over several of
the active one's timer passes, while a spec change reaches the ConfigMap; after the active
one is killed the standby resumes, reconciles, and writes the next spec change.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from tests.operator.k8s_helpers import G, P, V, deployment, poll
from tests.support.procs import free_port, spawn, stop

NS = "anchorage-ha"
PEERING = "ha"
LIFETIME_S = 4


class Replica:
    """One ``anchorage operator`` process: its log and its reconcile counter."""

    def __init__(self, name: str, priority: int, kubeconfig, workdir):
        self.name, self.port = name, free_port()
        self.log = workdir / f"operator-{name}.log"
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), POD_ID=f"operator-{name}",
                   PYTHONUNBUFFERED="1")
        self.proc = spawn([sys.executable, "-m", "anchorage", "operator", "--namespace", NS,
                           "--peering", PEERING, "--priority", str(priority),
                           "--peering-lifetime-s", str(LIFETIME_S), "--interval-s", "1",
                           "--metrics-port", str(self.port)], self.log, env=env)

    def reconciles(self) -> float:
        """Successful reconciliations of the test policy so far (0 before the first)."""
        assert self.proc.poll() is None, f"operator {self.name} exited:\n{self.output()}"
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if (line.startswith("anchorage_operator_reconciles_total{")
                    and 'acp="svc"' in line and 'result="ok"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self) -> str:
        return "\n".join(self.output().splitlines()[-25:])


def _policy(rmin: float) -> dict:
    return {"apiVersion": f"{G}/{V}", "kind": "AgentCachePolicy",
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {"targetRef": {"kind": "Deployment", "name": "svc"},
                     "policy": {"name": "hybrid", "parameters": {"rMin": rmin}},
                     "autoscaling": {"enabled": False},
                     # nothing listens on port 9: metrics unavailable, config still written
                     "metrics": {"prometheusURL": "http://127.0.0.1:9", "windowSeconds": 4}}}


@pytest.fixture(scope="module")
def ha_namespace(kube_api):
    from kubernetes import client

    client.CoreV1Api(kube_api).create_namespace({"metadata": {"name": NS}})
    co = client.CustomObjectsApi(kube_api)
    poll(lambda: co.create_namespaced_custom_object(
        "kopf.dev", "v1", NS, "kopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
         "metadata": {"name": PEERING, "namespace": NS}}), "KopfPeering object", 30)
    client.AppsV1Api(kube_api).create_namespaced_deployment(NS, deployment("svc", NS, 1))
    co.create_namespaced_custom_object(G, V, NS, P, _policy(0.5))
    return kube_api


def _config_rmin(api) -> float | None:
    from kubernetes import client

    cm = client.CoreV1Api(api).read_namespaced_config_map("svc-anchorage", NS)
    doc = yaml.safe_load(cm.data["anchorage.yaml"])
    return doc["policy"]["parameters"].get("rMin")


def _set_rmin(api, rmin: float) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        G, V, NS, P, "svc", {"spec": {"policy": {"parameters": {"rMin": rmin}}}})


def test_only_the_highest_priority_replica_reconciles_and_a_standby_takes_over(
        ha_namespace, cluster, tmp_path):
    api = ha_namespace
    low = high = None
    try:
        # alone, the low-priority replica is the active one
        low = Replica("low", 100, cluster.kubeconfig, tmp_path)
        poll(lambda: low.reconciles() >= 2, "the lone low-priority replica reconciling", 90)
        assert _config_rmin(api) == 0.5

        # a higher-priority replica starts: the low one pauses in its favour
        high = Replica("high", 200, cluster.kubeconfig, tmp_path)
        poll(lambda: "Pausing operations in favour of" in low.output(),
             "the low-priority replica pausing", 90)
        poll(lambda: high.reconciles() >= 2, "the high-priority replica reconciling", 90)
        # both keep-alives are in the peering object, under their POD_ID identities
        peers = poll(lambda: _peers(api) if {"operator-low", "operator-high"} <= set(_peers(api))
                     else None, "both replicas in the KopfPeering status", 30)
        assert peers["operator-high"]["priority"] == 200 and peers["operator-low"]["priority"] == 100
        assert peers["operator-high"]["lifetime"] == LIFETIME_S
        # (a reconcile already running when the pause came may finish: take the count after)
        start_high = high.reconciles()
        poll(lambda: high.reconciles() >= start_high + 1, "one more active pass", 60)
        idle_low = low.reconciles()
        _set_rmin(api, 0.7)
        poll(lambda: _config_rmin(api) == 0.7, "the active replica writing the new spec", 60)
        mark = high.reconciles()
        poll(lambda: high.reconciles() >= mark + 3, "three more active timer passes", 60)
        assert low.reconciles() == idle_low, (
            "the paused replica reconciled while a higher-priority one was active\n"
            f"--- low ---\n{low.tail()}\n--- high ---\n{high.tail()}")
        assert "Pausing" not in high.output(), high.tail()

        # the active replica dies without leaving the peering: the standby takes over once
        # the dead peer's keep-alive (lifetime 4 s) has expired
        high.proc.send_signal(signal.SIGKILL)
        high.proc.wait(10)
        poll(lambda: "Resuming operations after the pause" in low.output(),
             "the standby resuming", 90)
        poll(lambda: low.reconciles() >= idle_low + 2, "the standby reconciling", 60)
        # the standby removed the dead peer from the peering object
        poll(lambda: "operator-high" not in _peers(api), "the dead peer cleaned up", 30)
        _set_rmin(api, 0.9)
        poll(lambda: _config_rmin(api) == 0.9, "the standby writing the next spec change", 60)
        st = client_status(api)
        assert st["parameters"] == {"rMin": 0.9} and st["observedGeneration"] == 3, st
    finally:
        for r in (high, low):
            if r is not None:
                stop(r.proc)


def _peers(api) -> dict:
    from kubernetes import client

    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "kopf.dev", "v1", NS, "kopfpeerings", PEERING)
    return {k: v for k, v in (obj.get("status") or {}).items() if isinstance(v, dict)}


def client_status(api) -> dict:
    from kubernetes import client

    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        G, V, NS, P, "svc").get("status", {})


def test_peering_lifetime_option_is_validated():
    out = subprocess.run([sys.executable, "-m", "anchorage", "operator",
                          "--peering-lifetime-s", "1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert "--peering-lifetime-s must be at least 2" in out.stderr
    assert "Traceback" not in out.stderr
