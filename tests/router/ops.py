"""Operations the tests run inside the private network namespace (see netns_worker)."""

from __future__ import annotations

import asyncio
import itertools
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


def upstream_names() -> list[str]:
    return list(UP)


def set_mode(name: str, mode: str, delay_s: float = 0.0) -> None:
    UP[name].mode, UP[name].delay_s = mode, delay_s


def reset_upstreams() -> None:
    for u in UP.values():
        u.mode, u.delay_s = "ok", 0.0
        u.requests.clear()
        u.cached.clear()
        if u.runner is None:
            _run(u.start(u.port))


def stop_upstream(name: str) -> None:
    _run(UP[name].stop())


def upstream_requests(name: str) -> list[dict]:
    return list(UP[name].requests)


def start_ray() -> float:
    import ray
    from ray import serve
    t0 = time.time()
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             namespace="anchorage-test", logging_level="WARNING", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    return time.time() - t0


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
    return cfg.actor_name


def state_snapshot() -> list[dict]:
    import ray
    return ray.get(ray.get_actor(_state_name[0]).snapshot.remote())


def http(method: str, path: str, json: Any = None, headers: dict | None = None,
         content: bytes | None = None, timeout: float = 30) -> dict[str, Any]:
    with httpx.Client(timeout=timeout) as c:
        r = c.request(method, ROUTER + path, json=json, headers=headers, content=content)
        return {"status": r.status_code, "headers": dict(r.headers), "text": r.text}


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


def shutdown() -> None:
    try:
        import ray
        if ray.is_initialized():
            from ray import serve
            serve.shutdown()
            ray.shutdown()
    except Exception:  # noqa: BLE001
        pass
