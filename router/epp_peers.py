"""EPP decision sharing: the leader's decisions reach the followers, so a follower that
takes over routes on a warm state (sessions, agent members, prefix model) instead of
relearning it from the traffic.

Only the leader serves (``lease``); every ``sync_interval_s`` it sends the decisions it
made since the last round (``sync.encode``: replica URL, model, tenant, session, agent
hint, block keys, prompt length; JSON, never pickled) to each follower's
``POST /internal/v1/peer-decisions`` (the picker's HTTP port, ``metrics_port``) with the
internal token (``x-anchorage-internal``: ``ANCHORAGE_INTERNAL_TOKEN``, compared in
constant time). A follower applies them through the policy's ``on_peer_start``, the
router pods' path (``router/pods.py``). Fire and forget: a follower that misses a batch
is a little colder, never wrong; the leader never waits on it.

Followers are the pods of ``peer_selector`` (the pickers of the same pool; not only the
ready ones, since followers are never ready) with an IP other than this pod's, on
``peer_port``; or a static ``peers`` list. ``peer_urls(pods, port, own_ip)`` is the pure
rule.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

from anchorage.router.pods import PATH
from anchorage.router.sync import decode, encode

log = logging.getLogger("anchorage.router.epp")
MAX_BATCH_BYTES = 16 << 20


def peer_urls(pods: list[dict[str, Any]], port: int, own_ip: str) -> list[str]:
    out = set()
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        ip = status.get("podIP")
        if not ip or ip == own_ip or meta.get("deletionTimestamp"):
            continue
        out.add(f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}")
    return sorted(out)


class PeerPods:
    """Follow the peer pickers' pods (list, then watch; again on any end or failure)."""

    def __init__(self, api, namespace: str, selector: str, port: int, own_ip: str,
                 on_change: Callable[[list[str]], None], watch_s: int = 30) -> None:
        self.api, self.namespace, self.selector = api, namespace, selector
        self.port, self.own_ip, self.on_change, self.watch_s = port, own_ip, on_change, watch_s
        self._stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                pods, rv = self.api.list_pods(self.namespace, self.selector)
                by = {(p.get("metadata") or {}).get("name", ""): p for p in pods}
                started = time.monotonic()
                for ev in [None, *self.api.watch_pods(self.namespace, self.selector, rv,
                                                      self.watch_s)]:
                    if self._stop.is_set():
                        return
                    if ev is not None:
                        o = ev.get("object") or {}
                        key = (o.get("metadata") or {}).get("name", "")
                        if ev.get("type") == "DELETED":
                            by.pop(key, None)
                        elif ev.get("type") in ("ADDED", "MODIFIED"):
                            by[key] = o
                        else:
                            break
                    urls = peer_urls(list(by.values()), self.port, self.own_ip)
                    if urls != last:
                        self.on_change(urls)
                        last = urls
                if time.monotonic() - started < 1.0:
                    self._stop.wait(1.0)
            except Exception as exc:  # noqa: BLE001 - sharing is best effort; retry
                log.warning("peer picker discovery failed (%s); retrying", exc)
                self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()


class DecisionShare:
    """Both sides: ``push_loop`` on the leader, ``receive`` (an aiohttp handler) on all."""

    def __init__(self, state, session, token: str, interval_s: float, is_leader: Callable[[], bool],
                 peers: list[str] | None = None) -> None:
        self.state, self.session, self.token = state, session, token
        self.interval_s, self.is_leader = interval_s, is_leader
        self.peers: list[str] = list(peers or [])
        self.sent = self.applied = self.failed = 0
        state.outbox = []            # RoutingState.pick appends each decision here

    async def push_loop(self) -> None:
        import aiohttp
        timeout = aiohttp.ClientTimeout(total=2.0)
        while True:
            await asyncio.sleep(self.interval_s)
            batch, self.state.outbox = self.state.outbox, []
            if not batch or not self.is_leader() or not self.peers:
                continue
            body = encode(batch)
            hdr = {"x-anchorage-internal": self.token, "content-type": "application/json"}
            for url in list(self.peers):
                asyncio.ensure_future(self._post(url, body, hdr, timeout))

    async def _post(self, url: str, body: bytes, hdr: dict, timeout) -> None:
        try:
            async with self.session.post(url + PATH, data=body, headers=hdr,
                                         timeout=timeout) as r:
                if r.status == 200:
                    self.sent += 1
                    return
        except Exception:  # noqa: BLE001 - a follower that is away misses this batch
            pass
        self.failed += 1

    async def receive(self, request):
        from aiohttp import web

        from anchorage.router.errors import RouterError
        from anchorage.router.parsing import trusted
        if not trusted(request.headers, self.token):
            err = RouterError(403, "peer decisions need the internal token", "permission_error",
                              "forbidden")
            return web.Response(body=err.body(), status=403, content_type="application/json")
        if (request.content_length or 0) > MAX_BATCH_BYTES:
            return web.Response(status=413)
        try:
            rows = decode(await request.read())
        except (ValueError, RecursionError) as exc:
            return web.Response(status=400, text=f"bad decision batch: {exc}")
        if not self.is_leader():       # a leader routes on its own decisions
            for _, url, model, ctx in rows:
                if self.state.on_peer_start(url, model, ctx):
                    self.applied += 1
        return web.Response(body=b"{}", content_type="application/json")
