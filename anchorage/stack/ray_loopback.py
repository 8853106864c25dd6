"""Keep the stack's local Ray (2.60) and Serve on loopback: nothing listens beyond
127.0.0.1 and nothing reaches for an outside address, so ``anchorage up`` needs no
network namespace.

What Ray does by itself, and what is done about it here:

- The node IP: Ray finds it by asking for the source address of a UDP socket "connected"
  to 8.8.8.8:53 (``ray._private.services.get_node_ip_address`` ->
  ``ray._raylet.node_ip_address_from_perspective``), and ``ray.init(_node_ip_address=
  "127.0.0.1")`` alone does not prevent it: ``ray.init`` passes a loopback address through
  ``resolve_ip_for_localhost``, which *replaces* it with that probe's answer (the host's
  outside address, wherever there is a default route). ``ENV`` turns Ray's cluster mode
  off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, despite its name read on every platform
  as ``ray_constants.ENABLE_RAY_CLUSTER``; it only decides this resolution and whether
  ``ray start`` may join nodes): ``get_node_ip_address`` then answers 127.0.0.1 without
  probing. ``init_kwargs`` also pins ``_node_ip_address``; every Ray process (GCS,
  raylet, dashboard, workers) gets it as ``--node-ip-address``, and worker processes
  answer ``ray.util.get_node_ip_address()`` from it.
- The dashboard head always starts (``include_dashboard=False`` only trims its modules);
  its ``UsageStatsHead`` looks for ``~/ray_bootstrap_config.yaml`` and, when that file is
  missing, probes cloud metadata servers (``http://169.254.169.254``,
  ``metadata.google.internal``: a DNS query) even with usage stats off.
  ``prepare_home`` writes that file into the router's private HOME naming a local
  provider (no other part of a local Ray reads it).
- Every Serve replica starts an inter-deployment gRPC server on ``[::]:0`` (all
  interfaces; ``ray.serve._private.replica``, via ``ray._common.tls_utils.
  add_port_to_grpc_server``). ``setup_worker`` (Ray's ``worker_process_setup_hook``,
  run in every worker process before it runs any task or actor) makes that helper bind
  127.0.0.1 instead of every interface; peers reach it at the node IP, 127.0.0.1."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOOPBACK = "127.0.0.1"
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}   # set before `import ray` (read at import)
_ANY = ("[::]:", "0.0.0.0:", ":")
log = logging.getLogger("anchorage.stack.ray_loopback")


def init_kwargs() -> dict:
    """Extra ``ray.init`` arguments for a loopback-only local Ray."""
    return {"_node_ip_address": LOOPBACK, "dashboard_host": LOOPBACK,
            "runtime_env": {"worker_process_setup_hook":
                            "anchorage.stack.ray_loopback.setup_worker"}}


def prepare_home(home: str | Path) -> Path:
    """Write ``<home>/ray_bootstrap_config.yaml`` (a local provider) unless present."""
    path = Path(home) / "ray_bootstrap_config.yaml"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML; read only by the usage-stats module, which then skips its probes
        path.write_text('{"provider": {"type": "local"}}\n')
    return path


def loopback_address(address: str) -> str:
    """``[::]:PORT`` / ``0.0.0.0:PORT`` / ``:PORT`` -> ``127.0.0.1:PORT``; others unchanged."""
    for prefix in _ANY:
        if address.startswith(prefix):
            return f"{LOOPBACK}:{address[len(prefix):]}"
    return address


def setup_worker() -> None:
    """Ray worker hook: gRPC servers Ray asks to bind every interface bind loopback."""
    try:
        from ray._common import tls_utils
    except ImportError:  # a Ray without the helper: nothing to patch, the test will say
        log.warning("ray._common.tls_utils not found; Serve's replica gRPC port stays on "
                    "every interface")
        return
    original = getattr(tls_utils.add_port_to_grpc_server, "__wrapped__",
                       tls_utils.add_port_to_grpc_server)

    def add_port_to_grpc_server(server, address):
        return original(server, loopback_address(address))
    add_port_to_grpc_server.__wrapped__ = original  # type: ignore[attr-defined]
    tls_utils.add_port_to_grpc_server = add_port_to_grpc_server
    replica = sys.modules.get("ray.serve._private.replica")   # imported its own reference
    if replica is not None and hasattr(replica, "add_port_to_grpc_server"):
        replica.add_port_to_grpc_server = add_port_to_grpc_server
