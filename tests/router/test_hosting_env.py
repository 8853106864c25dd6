"""The environment of the Ray that hosts a local router (``router.app.hosting_env``), without
Ray: Serve's proxy timeouts are raised for a busy node with either ingress, and a value
already in the environment wins."""

from __future__ import annotations

from anchorage.router.app import SERVE_PROXY_TIMEOUTS, hosting_env
from anchorage.router.config import RouterConfig


def test_proxy_timeouts_for_either_ingress_and_the_environment_wins(monkeypatch, tmp_path):
    for k in SERVE_PROXY_TIMEOUTS:
        monkeypatch.delenv(k, raising=False)
    serve = hosting_env(RouterConfig(replicas=["http://x"], ingress="serve"))
    assert serve == SERVE_PROXY_TIMEOUTS
    assert float(serve["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) > 5      # Ray's default
    env = hosting_env(RouterConfig(replicas=["http://x"]), str(tmp_path))
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert {k: env[k] for k in SERVE_PROXY_TIMEOUTS} == SERVE_PROXY_TIMEOUTS
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "120")
    env = hosting_env(RouterConfig(replicas=["http://x"]), str(tmp_path))
    assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "120"
