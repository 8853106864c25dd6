"""Replica discovery against a real kube-apiserver 1.20 on loopback (tests/support/k8s):
the Endpoints watch follows creates, updates and deletes of the replicas' Endpoints.
(1.20 serves EndpointSlice only as v1beta1; the EndpointSlice path is covered by the pure
``urls_from`` tests.)"""

from __future__ import annotations

import queue
import threading

import pytest

from tests.conftest import need

# the test cluster's serving certificate is self-signed (kubeconfig skips verification)
pytestmark = pytest.mark.filterwarnings("ignore:Unverified HTTPS request")


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    from tests.support import k8s

    gone = k8s.missing()
    need(not gone, f"Kubernetes 1.20 binaries ({', '.join(gone)})", k8s.BUILD_HINT)
    c = k8s.LocalCluster(tmp_path_factory.mktemp("k8s-router"), controller_manager=False).start()
    yield c
    c.stop()


def endpoints(name, ips, labels):
    return {"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "labels": labels},
            "subsets": [{"addresses": [{"ip": ip} for ip in ips],
                         "ports": [{"port": 8000, "name": "http"}]}] if ips else []}


def test_endpoints_watch_follows_the_replicas(kube):
    from kubernetes import client, config

    from anchorage.router.discovery import KubeClientAPI, KubernetesSource

    api_client = config.new_client_from_config(str(kube.kubeconfig))
    core = client.CoreV1Api(api_client)
    src = KubernetesSource(KubeClientAPI("Endpoints", api_client=api_client), "default",
                           "app=vllm", 8000, watch_timeout_s=5)
    seen: queue.Queue = queue.Queue()
    t = threading.Thread(target=src.watch, args=(seen.put,), daemon=True)
    t.start()
    try:
        assert seen.get(timeout=20) == []
        core.create_namespaced_endpoints("default", endpoints("vllm", ["10.1.0.1"], {"app": "vllm"}))
        core.create_namespaced_endpoints("default", endpoints("other", ["10.9.0.1"], {"app": "db"}))
        assert seen.get(timeout=20) == ["http://10.1.0.1:8000"]
        core.replace_namespaced_endpoints("vllm", "default",
                                          endpoints("vllm", ["10.1.0.1", "10.1.0.2"], {"app": "vllm"}))
        assert seen.get(timeout=20) == ["http://10.1.0.1:8000", "http://10.1.0.2:8000"]
        core.delete_namespaced_endpoints("vllm", "default")
        assert seen.get(timeout=20) == []
        assert seen.empty()                # the app=db Endpoints never showed up
    finally:
        src.stop()
