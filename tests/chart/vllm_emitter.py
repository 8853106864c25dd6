"""vLLM's own Prometheus exporter (``vllm.v1.metrics.loggers.PrometheusStatLogger``, the
code behind an engine's ``/metrics``) for the dashboard tests, in its own process:

    python -m tests.chart.vllm_emitter PORT_FILE MODEL_NAME HIT_RATE [HIT_RATE ...]

One engine index per hit rate (vLLM labels them ``engine="0"``, ``"1"``...); every 0.1 s
each records a scheduler step (running and waiting requests, KV usage, a prefix-cache
lookup of 100 tokens of which ``HIT_RATE`` x 100 hit) and an iteration (100 prompt tokens,
one first token after 0.05 s), as vLLM's engine core does. The real logger renders every
``vllm:*`` series; they are served on a loopback port (written to ``PORT_FILE`` once the
first step is recorded) in the format prometheus_client negotiates from the request's
``Accept`` header, as vLLM's ``/metrics`` does. ``?accept=...`` stands in for the header:
the chart's PodMonitor asks for the classic text format (``scrapeProtocols``), which a
Prometheus older than 2.49 (the tests' 2.42) cannot be told to ask for."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

TOKENS_PER_STEP = 100


def serve(registry):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    from prometheus_client.exposition import choose_encoder

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            q = parse_qs(urlsplit(self.path).query)
            accept = q["accept"][0] if "accept" in q else self.headers.get("Accept", "")
            encoder, ctype = choose_encoder(accept)
            body = encoder(registry)
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    port_file, model, rates = Path(argv[0]), argv[1], [float(r) for r in argv[2:]]
    from prometheus_client import REGISTRY
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import (IterationStats, PrefixCacheStats, PromptTokenStats,
                                       SchedulerStats)

    from anchorage.stack.tiny_model import write_tiny_model

    d = write_tiny_model(tempfile.mkdtemp(prefix="vllm-emitter-"))
    cfg = EngineArgs(model=str(d), skip_tokenizer_init=True, load_format="dummy",
                     enforce_eager=True, enable_prefix_caching=True, block_size=32,
                     max_model_len=2048, served_model_name=[model],
                     kv_cache_memory_bytes=1 << 26).create_engine_config()
    engines = list(range(len(rates)))
    logger = PrometheusStatLogger(cfg, engines)
    server = serve(REGISTRY)

    def step() -> None:
        for idx, rate in zip(engines, rates):
            hits = int(round(rate * TOKENS_PER_STEP))
            sched = SchedulerStats(num_running_reqs=2 + idx, num_waiting_reqs=1 + idx,
                                   kv_cache_usage=0.4 + 0.2 * idx,
                                   prefix_cache_stats=PrefixCacheStats(
                                       requests=1, queries=TOKENS_PER_STEP, hits=hits))
            it = IterationStats()
            it.prompt_token_stats = PromptTokenStats(
                computed=TOKENS_PER_STEP - hits, local_cache_hit=hits, cached_tokens=hits,
                total=TOKENS_PER_STEP)
            it.num_generation_tokens = 4
            it.time_to_first_tokens_iter = [0.05]
            logger.record(sched, it, engine_idx=idx)

    step()
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(port_file)
    while True:
        time.sleep(0.1)
        step()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
