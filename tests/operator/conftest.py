"""Session-scoped real services for the operator's integration tests (loopback only)."""

from __future__ import annotations

import pytest

from tests.conftest import need


@pytest.fixture(scope="session")
def exporters():
    from tests.support.prometheus import VLLMExporter

    exps = [VLLMExporter(), VLLMExporter()]
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
