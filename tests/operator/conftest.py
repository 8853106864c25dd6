"""Session-scoped real services for the operator's integration tests (loopback only)."""

from __future__ import annotations

import pytest

from tests.conftest import need


@pytest.fixture(scope="session")
def exporters():
    from tests.support.prometheus import VLLMExporter

    # one exporter per metric name the operator reads for premature evictions: the contract's
    # (the node agent's) and the earlier one kept for compatibility
    exps = [VLLMExporter(), VLLMExporter(evictions_reused="anchorage_evictions_reused_soon")]
    yield exps
    for e in exps:
        e.close()


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory, exporters):
    from tests.support.prometheus import LocalPrometheus, prometheus_binary

    need(prometheus_binary() is not None, "the prometheus server binary",
         "apt-get install prometheus (scripts/setup.d/40-prometheus.sh)")
    prom = LocalPrometheus(tmp_path_factory.mktemp("prometheus"),
                           [f"127.0.0.1:{e.port}" for e in exporters]).start()
    yield prom
    prom.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    from tests.support import k8s

    gone = k8s.missing()
    need(not gone, f"Kubernetes 1.20 binaries ({', '.join(gone)})", k8s.BUILD_HINT)
    c = k8s.LocalCluster(tmp_path_factory.mktemp("k8s")).start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def kube_api(cluster):
    """An ApiClient for the test cluster with the project's CRDs (manifests/crd/) established."""
    import os

    import urllib3
    import yaml

    from tests.operator.k8s_helpers import CRD_DIR, poll

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # self-signed, loopback
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    from kubernetes import client, config

    config.load_kube_config(config_file=str(cluster.kubeconfig))
    api = client.ApiClient()
    ext = client.ApiextensionsV1Api(api)
    for f in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                ext.create_custom_resource_definition(doc)

    def established():
        for crd in ext.list_custom_resource_definition().items:
            if not any(c.type == "Established" and c.status == "True"
                       for c in (crd.status.conditions or [])):
                return False
        return True

    poll(established, "CRDs established", 30)
    return api
