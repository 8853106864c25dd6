"""`anchorage node-agent` as a process: serves health, stops cleanly on SIGTERM, reports bad
input as one line (no traceback)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx

from tests.conftest import REPO
from tests.support.procs import free_port

CMD = [sys.executable, "-c", "import sys; from anchorage.cli import main; sys.exit(main())",
       "node-agent"]


def test_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen(CMD + ["--engine-url", f"http://127.0.0.1:{free_port()}",
                                   "--state-dir", str(tmp_path), "--listen",
                                   f"127.0.0.1:{port}", "--tick", "0.1"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
                time.sleep(0.2)
        assert r.status_code == 200
        r = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert r.status_code == 503 and "engine" in r.text   # no engine behind it
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'anchorage_policy_info{mode="stock",model_name="",policy="off"} 1.0' in text
        # the sample rate handed to the plugin
        assert (tmp_path / "sidecar.json").read_text() == '{"access_log_sample_rate":0.05}'
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "node agent stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_input_is_one_line():
    for args, msg in ((["--listen", "nowhere"], "--listen must be HOST:PORT"),
                      (["--engine-url", "localhost:8000"], "engine URL must be http"),
                      (["--access-log-sample-rate", "2"], "sample_rate must be in [0, 1]"),
                      (["--warmup-r-min", "-1"], "r_min must be in [0, 1]")):
        p = subprocess.run(CMD + args, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert msg in p.stderr and "Traceback" not in p.stderr


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run(CMD + ["--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path)],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in p.stderr
    assert "Traceback" not in p.stderr
