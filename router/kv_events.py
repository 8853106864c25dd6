"""Subscribe to replicas' vLLM KV event streams (ZMQ PUB, msgpack ``KVEventBatch``).

One SUB socket per replica endpoint, all polled by one daemon thread; decoded events are
handed to ``sink(replica_url, events)`` (the routing state queues them and applies them
on its own thread before the next decision). Endpoints can change at run time
(``set_endpoints``), e.g. when discovery adds a replica. vLLM's publisher must be
started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "topic": "kv"}'`` (``ipc://`` paths work the same way).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from anchorage.routing.vllm_events import decode_batch

log = logging.getLogger("anchorage.router.kv_events")


class KVEventSubscriber:
    def __init__(self, sink: Callable[[str, list[dict]], None], topic: str = "kv") -> None:
        self.sink = sink
        self.topic = topic.encode()
        self._want: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.batches = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")

    def start(self) -> "KVEventSubscriber":
        self._thread.start()
        return self

    def set_endpoints(self, endpoints: dict[str, str]) -> None:
        with self._lock:
            self._want = dict(endpoints)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context.instance()
        socks: dict[str, tuple[str, zmq.Socket]] = {}     # url -> (endpoint, socket)
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                with self._lock:
                    want = dict(self._want)
                for url in list(socks):
                    if want.get(url) != socks[url][0]:
                        poller.unregister(socks[url][1])
                        socks.pop(url)[1].close(linger=0)
                for url, ep in want.items():
                    if url not in socks:
                        s = ctx.socket(zmq.SUB)
                        s.setsockopt(zmq.SUBSCRIBE, self.topic)
                        s.connect(ep)
                        poller.register(s, zmq.POLLIN)
                        socks[url] = (ep, s)
                by_sock = {s: url for url, (_, s) in socks.items()}
                for s, _ in poller.poll(100):
                    parts = s.recv_multipart()
                    try:
                        events = decode_batch(parts[-1])
                    except ValueError as exc:
                        self.errors += 1
                        log.warning("dropping a KV event batch from %s: %s", by_sock[s], exc)
                        continue
                    self.batches += 1
                    self.sink(by_sock[s], events)
        finally:
            for _, s in socks.values():
                s.close(linger=0)
