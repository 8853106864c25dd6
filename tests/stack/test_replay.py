"""The replayer against a fake streaming upstream on loopback: every request's outcome is
counted (200 + usage = ok; HTTP errors, stream error events, missing usage = failed),
TTFT and cached tokens are read from the stream, sessions run in order, and at most
``max_sessions`` sessions are in flight."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from anchorage.drive.plan import PlanOptions, plan
from anchorage.drive.replay import replay
from anchorage.trace.format import TraceRecord


class Upstream:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.max_active_sessions = 0
        self.seen: list[tuple[str, int]] = []
        up = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                sid = self.headers.get("x-session-id")
                n = len(body["prompt"])
                with up.lock:
                    up.seen.append((sid, n))
                if n == 7:                                   # an HTTP error
                    self.send_response(503)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"no")
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                time.sleep(0.02)
                self.wfile.write(b'data: {"choices": [{"text": ""}]}\n\n')
                self.wfile.flush()
                if n == 9:                                   # broken mid-stream
                    self.wfile.write(b'data: {"error": {"type": "upstream_error"}}\n\n')
                    return
                usage = {"prompt_tokens": n, "completion_tokens": 1,
                         "prompt_tokens_details": {"cached_tokens": n // 2}}
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                                 "data: [DONE]\n\n".encode())

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_port}"


def rec(ts, sid, n):
    return TraceRecord(timestamp=ts, hash_ids=[1], output_length=1, input_length=n,
                       session_id=sid)


def test_outcomes_are_counted_and_read_from_the_stream():
    up = Upstream()
    try:
        recs = [rec(0, "a", 4), rec(1, "a", 8), rec(2, "b", 7), rec(3, "c", 9)]
        plans = plan(recs, PlanOptions(block_size=16, time_compression=1000))
        results, wall = asyncio.run(replay(up.url, plans, concurrency=4))
        by = {r.index: r for r in results}
        assert len(results) == 4 and wall > 0
        assert by[0].ok and by[1].ok and by[1].cached_tokens == 4 and by[1].prompt_tokens == 8
        assert by[0].ttft_s is not None and by[0].ttft_s <= by[0].latency_s
        assert not by[2].ok and by[2].status == 503 and "HTTP 503" in by[2].error
        assert not by[3].ok and "upstream_error" in by[3].error
        assert [n for s, n in up.seen if s == "a"] == [4, 8]          # in session order
    finally:
        up.srv.shutdown()


def test_at_most_max_sessions_in_flight():
    up = Upstream()
    try:
        recs = [rec(i, f"s{i % 6}", 4 + (i // 6) * 2) for i in range(18)]   # 6 sessions x 3
        plans = plan(recs, PlanOptions(block_size=16, time_compression=1e6))
        results, _ = asyncio.run(replay(up.url, plans, concurrency=8, max_sessions=2))
        assert len(results) == 18 and all(r.ok for r in results)
        # with 2 slots, a session's first request is sent only after an earlier session ended
        ends: dict[str, float] = {}
        starts: dict[str, float] = {}
        for r in results:
            starts[r.session] = min(starts.get(r.session, 1e9), r.sent_s)
            ends[r.session] = max(ends.get(r.session, 0.0), r.sent_s + r.latency_s)
        order = sorted(starts, key=starts.get)
        assert order == [f"s{i}" for i in range(6)]
        for t in (starts[s] + 1e-4 for s in order):
            live = [s for s in order if starts[s] <= t < ends[s]]
            assert len(live) <= 2, (t, live)
    finally:
        up.srv.shutdown()
