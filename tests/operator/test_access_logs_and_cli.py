"""Access-log loading (file and http on loopback) and `anchorage operator` argument errors."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from anchorage.operator.access_logs import AccessLogError, load_access_logs
from tests.operator.access_log import write_access_log


def test_file_and_http_sources_merge_by_time(tmp_path, monkeypatch):
    log = write_access_log(tmp_path / "a.jsonl", turns=2)
    body = log.read_bytes()
    monkeypatch.setenv("ANCHORAGE_ACCESS_LOG_TOKEN", "op-token")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.headers.get("authorization") != "Bearer op-token":
                self.send_error(401)   # a node agent serves its log only to the operator
                return
            if self.path != "/access-log":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        recs = load_access_logs([str(log), url + "/access-log"], max_requests=10_000)
        single = load_access_logs([str(log)], max_requests=10_000)
        assert len(recs) == 2 * len(single)
        assert [r.timestamp for r in recs] == sorted(r.timestamp for r in recs)
        assert len(load_access_logs([str(log)], max_requests=5)) == 5
        with pytest.raises(AccessLogError, match="404"):
            load_access_logs([url + "/nope"], max_requests=10)
        with pytest.raises(AccessLogError, match="401"):
            load_access_logs([url + "/access-log"], max_requests=10, token="")
    finally:
        srv.shutdown()
        srv.server_close()


def test_operator_command_rejects_bad_arguments_without_traceback():
    exe = Path(sys.executable).parent / "anchorage"  # the console script
    r = subprocess.run([str(exe), "operator", "--interval-s", "-1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--interval-s must be positive" in r.stderr and "Traceback" not in r.stderr
