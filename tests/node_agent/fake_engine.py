"""A fake vLLM engine on 127.0.0.1 for sidecar unit tests: /metrics with settable load,
/v1/models, /v1/completions (recorded), and a ZMQ PUB that publishes KVEventBatch frames
exactly as vLLM 0.32 does (topic, sequence number, msgpack ``[ts, events]``)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import msgpack


class FakeEngine:
    def __init__(self, kv_endpoint: str, model: str = "tiny"):
        import zmq

        self.model = model
        self.running = 0
        self.waiting = 0
        self.completions: list[dict[str, Any]] = []
        self.fail_completions = False
        self.on_completion: Callable[[dict[str, Any]], None] | None = None
        self._seq = 0
        self._ctx = zmq.Context()
        self.pub = self._ctx.socket(zmq.PUB)
        self.pub.bind(kv_endpoint)
        self._lock = threading.Lock()
        eng = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else body
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/metrics":
                    self._send(200, (
                        f'vllm:num_requests_running{{model_name="{eng.model}"}} {eng.running}.0\n'
                        f'vllm:num_requests_waiting{{model_name="{eng.model}"}} {eng.waiting}.0\n'),
                        "text/plain")
                elif self.path == "/v1/models":
                    self._send(200, json.dumps({"data": [{"id": eng.model}]}))
                else:
                    self._send(404, "{}")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions" or eng.fail_completions:
                    self._send(500, "{}")
                    return
                eng.completions.append(body)
                if eng.on_completion is not None:
                    eng.on_completion(body)
                self._send(200, json.dumps({"choices": [{"text": "x"}],
                                            "usage": {"prompt_tokens": len(body["prompt"])}}))

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def publish(self, events: list[dict[str, Any]], ts: float | None = None) -> None:
        with self._lock:
            self._seq += 1
            payload = msgpack.packb([time.time() if ts is None else ts, events])
            self.pub.send_multipart([b"kv", self._seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self.http.shutdown()
        self.pub.close(linger=0)
        self._ctx.term()


def stored(hashes: list[bytes], parent: bytes | None, tokens: list[int], bs: int) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": bs, "lora_id": None, "medium": "GPU"}


def removed(hashes: list[bytes]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
