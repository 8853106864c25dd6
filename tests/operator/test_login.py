"""The operator's login inside a pod names the API server by the address every pod is given
(KUBERNETES_SERVICE_HOST/PORT), not by kopf's cluster-DNS name: on a cluster without DNS
the chart's end-to-end test found the operator crash-looping on kubernetes.default.svc."""

from __future__ import annotations

import pytest

from tests.conftest import need_module


@pytest.fixture(scope="module")
def handlers():
    need_module("kopf")
    from anchorage.operator import handlers as h
    return h


def test_server_from_the_pod_environment(handlers):
    f = handlers.in_cluster_server
    assert f({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) \
        == "https://10.96.0.1:443"
    assert f({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}) \
        == "https://[fd00::1]:6443"
    assert f({}) is None
    assert f({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None


def test_login_uses_the_service_address_and_keeps_the_token(handlers, monkeypatch):
    import kopf

    seen = {}

    def sa(**kw):
        seen["kw"] = kw
        return kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t",
                                   ca_path="/ca.crt", default_namespace="llm")

    monkeypatch.setattr(kopf, "login_with_service_account", sa)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = handlers.login(settings=None, logger=None)
    assert info.server == "https://10.96.0.1:443"
    assert (info.token, info.ca_path, info.default_namespace) == ("t", "/ca.crt", "llm")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    assert handlers.login(settings=None).server == "https://kubernetes.default.svc"


def test_login_outside_a_pod_reads_the_kubeconfig(handlers, monkeypatch):
    import kopf

    monkeypatch.setattr(kopf, "login_with_service_account", lambda **kw: None)
    monkeypatch.setattr(kopf, "login_with_kubeconfig",
                        lambda **kw: kopf.ConnectionInfo(server="https://10.99.0.1:6443"))
    assert handlers.login(settings=None).server == "https://10.99.0.1:6443"
