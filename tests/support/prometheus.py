"""A real Prometheus server on loopback scraping exporters that the test controls, and a
small vLLM-shaped exporter (prometheus_client) whose hit rate, queue and KV usage are set
by the test.
"""

from __future__ import annotations

import shutil
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tests.support.procs import free_port, spawn, stop, wait_until


def serve_text_format(registry, port: int = 0) -> ThreadingHTTPServer:
    """Serve ``registry`` on 127.0.0.1:``port`` (0: any free port) in the classic text format
    0.0.4 only, as vLLM's own endpoint answers Prometheus: prometheus_client's own server
    would negotiate OpenMetrics, which rewrites the colons of vLLM's ``vllm:*`` names."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class VLLMExporter:
    """Emits vllm:prefix_cache_{hits,queries}_total, vllm:num_requests_waiting,
    vllm:kv_cache_usage_perc and anchorage_evictions_reused_total (or, with
    ``evictions_reused="anchorage_evictions_reused_soon"``, the earlier name the operator still
    reads); counters advance at the rates last ``set`` (integrated at scrape time, so no
    background thread)."""

    def __init__(self, model: str = "test-model", prefix: str = "vllm:",
                 evictions_reused: str = "anchorage_evictions_reused"):
        self.model, self.prefix, self.evictions_reused = model, prefix, evictions_reused
        self._lock = threading.Lock()
        self._t = time.monotonic()
        self.hits = self.queries = self.soon = 0.0
        self.queries_per_s, self.hit_rate, self.waiting, self.kv = 0.0, 0.0, 0.0, 0.0
        self.soon_per_s = 0.0
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.port = free_port()
        self._server = serve_text_format(self.registry, self.port)

    def set(self, *, hit_rate: float, queries_per_s: float = 1000.0, waiting: float = 0.0,
            kv: float = 0.2, soon_evictions_per_s: float = 0.0) -> None:
        with self._lock:
            self._advance()
            self.hit_rate, self.queries_per_s = hit_rate, queries_per_s
            self.waiting, self.kv, self.soon_per_s = waiting, kv, soon_evictions_per_s

    def _advance(self) -> None:
        now = time.monotonic()
        dt, self._t = now - self._t, now
        self.queries += self.queries_per_s * dt
        self.hits += self.queries_per_s * self.hit_rate * dt
        self.soon += self.soon_per_s * dt

    def collect(self):
        with self._lock:
            self._advance()
            labels = ["model_name"]
            p = self.prefix
            for name, val in ((f"{p}prefix_cache_hits", self.hits),
                              (f"{p}prefix_cache_queries", self.queries),
                              (self.evictions_reused, self.soon)):
                c = CounterMetricFamily(name, name, labels=labels)
                c.add_metric([self.model], val)
                yield c
            for name, val in ((f"{p}num_requests_waiting", self.waiting),
                              (f"{p}kv_cache_usage_perc", self.kv)):
                g = GaugeMetricFamily(name, name, labels=labels)
                g.add_metric([self.model], val)
                yield g

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


@dataclass
class LocalPrometheus:
    workdir: Path
    targets: list[str]
    job: str = "vllm"
    scrape_interval_s: float = 1.0
    port: int = field(default_factory=free_port)
    _proc: object = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LocalPrometheus":
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        targets = ", ".join(f"'{t}'" for t in self.targets)
        cfg.write_text(
            f"global: {{scrape_interval: {int(self.scrape_interval_s * 1000)}ms, "
            f"evaluation_interval: {int(self.scrape_interval_s * 1000)}ms}}\n"
            f"scrape_configs:\n- job_name: {self.job}\n  static_configs:\n"
            f"  - targets: [{targets}]\n")
        self._proc = spawn([prometheus_binary(), f"--config.file={cfg}",
                            f"--storage.tsdb.path={self.workdir / 'data'}",
                            f"--web.listen-address=127.0.0.1:{self.port}"],
                           self.workdir / "prometheus.log")
        wait_until(lambda: urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200,
                   "prometheus", 30, self._proc, self.workdir / "prometheus.log")
        return self

    def stop(self) -> None:
        stop(self._proc)
        self._proc = None
