"""The router's pods as the chart renders them: several Deployment-mode pods share routing
decisions (peer discovery through the router Service's Endpoints, pod identity from the
Downward API), and every Ray that hosts the router starts with Serve's HAProxy ingress."""

from __future__ import annotations

from tests.chart.conftest import all_on_values, objects, one, render


def _env(c: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_several_router_pods_share_decisions_through_their_endpoints():
    docs = objects(render({"router": {"replicaCount": 2, "extraEnv": [
        {"name": "ANCHORAGE_INTERNAL_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}}))
    dep = one(docs, "Deployment", "-router")
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--peer-selector=app.kubernetes.io/instance=anc,app.kubernetes.io/component=router" in c["args"]
    env = _env(c)
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    role = one(docs, "Role", "-router")
    assert any("endpoints" in r["resources"] and "watch" in r["verbs"] for r in role["rules"])
    svc = one(docs, "Service", "-router")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "router" and svc["spec"]["selector"].items() <= labels.items()


def test_one_router_pod_has_no_peers():
    docs = objects(render({}))
    c = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--peer") for a in c["args"])


def test_a_terminating_router_keeps_serving_until_the_service_has_let_it_go():
    """The behaviour (no request refused during a rolling upgrade) is tests/cluster's
    test 6 on a real cluster; here, that the pause fits in the grace period."""
    pod = one(objects(render({})), "Deployment", "-router")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[0] == "sleep" and 0 < int(cmd[1]) < pod["terminationGracePeriodSeconds"] - 10


def test_the_kuberay_head_starts_ray_with_the_haproxy_ingress():
    docs = objects(render(all_on_values()))
    rs = one(docs, "RayService", "-router")
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = _env(head)
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert env["RAY_SERVE_HAPROXY_BALANCE_ALGORITHM"] == "hdr(x-session-id)"


def test_the_body_timeout_value_cuts_off_a_body_that_stops_part_way():
    """``router.bodyTimeoutSeconds`` -> ``--body-timeout-s`` -> the router answers a body
    that stops part-way with a 408 error object naming that time (issue 45 item 2). The
    router runs the rendered arguments (one process, on loopback instead of the pod's
    0.0.0.0, without the pod's ConfigMap directory)."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from anchorage.stack.ports import free_port

    docs = objects(render({"router": {"bodyTimeoutSeconds": 1.5, "discovery": {
        "mode": "static", "staticReplicas": ["http://127.0.0.1:9"]}}}))
    c = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]["containers"][0]
    assert "--body-timeout-s=1.5" in c["args"]
    args = [a for a in c["args"] if not a.startswith(("--host=", "--port=", "--config-dir="))]
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "anchorage.cli", *args, "--host=127.0.0.1",
                             f"--port={port}", "--hosting=process"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
                time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": [1,")
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                got = s.recv(4096)
                if not got:
                    break
                data += got
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), data[:300]
        err = json.loads(body)["error"]
        assert err["code"] == "request_timeout" and "within 1.5 s" in err["message"], err
    finally:
        proc.terminate()
        proc.wait(20)
