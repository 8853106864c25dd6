"""Routing state shared between router *pods* (each its own Ray), over the pod network.

Within one pod the router replicas share decisions through the ``DecisionLog`` actor
(``sync``). Pods that run their own Ray (the chart's Deployment mode with several router
pods) reach each other only over HTTP, so each replica also pushes what it hands its own
log (its new decisions, as a JSON batch, and its in-flight count per upstream) to every
other router pod:

    POST /internal/v1/peer-decisions   x-anchorage-internal: <ANCHORAGE_INTERNAL_TOKEN>
    {"origin": "<pod>/<replica>", "pod": "<pod>", "load": {url: n}, "batch": [...]}

The receiving replica checks the token (no token configured: the endpoint refuses
everything, 403), the size and the shape of the batch (``sync.decode``), and ingests it
into its own pod's log, from which every replica of that pod applies it as it applies
its neighbours' (``on_peer_start``; the peers' in-flight counts join the load view with
the same time-to-live). Only decisions made in a pod are pushed, so nothing loops; a
batch from one's own pod is dropped. Staleness is the push interval plus one HTTP round
trip (the same histogram measures it, on wall clocks of two pods).

Peers: a static list of router pod URLs (``peers``), or the ready addresses of the
router's own Service Endpoints found by label (``peer_selector``, the same Kubernetes
discovery as for engines), minus this pod's own address (``POD_IP``). A push that fails
is counted (``anchorage_router_peer_sync_errors_total``) and dropped: the next one
carries the new decisions; routing never waits on a peer.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from anchorage.router import fastjson
from anchorage.router.sync import decode

log = logging.getLogger("anchorage.router")
PATH = "/internal/v1/peer-decisions"
MAX_BATCH_BYTES = 8 << 20
REFRESH_INTERVALS = 5          # push load even without new decisions every N intervals


class PodPeers:
    def __init__(self, state, session, token: str, pod: str, peers: list[str] | None = None,
                 own_ip: str = "") -> None:
        self.state, self.session, self.token, self.pod = state, session, token, pod
        self.own_ip = own_ip
        self.urls: list[str] = []
        self.set_peers(peers or [])
        self.sent = self.received = self.errors = 0
        self._idle = 0
        self._inflight: set[asyncio.Task] = set()

    def set_peers(self, urls: list[str]) -> None:
        own = f"//{self.own_ip}:" if self.own_ip else None
        self.urls = [u.rstrip("/") for u in urls if not (own and own in u)]

    # -- sending -----------------------------------------------------------------------
    def push(self, origin: str, payload: bytes | None, load: dict[str, int]) -> None:
        if not self.urls or not self.token:
            return
        if payload is None:
            self._idle += 1
            if self._idle < REFRESH_INTERVALS and not load:
                return
        self._idle = 0
        body = (b'{"origin":' + fastjson.dumps(f"{self.pod}/{origin}") + b',"pod":'
                + fastjson.dumps(self.pod) + b',"load":' + fastjson.dumps(load)
                + b',"batch":' + (payload or b"[]") + b"}")
        for url in self.urls:
            if len(self._inflight) > 4 * len(self.urls):     # a slow peer: drop, do not pile up
                self.errors += 1
                self.state.metrics.peer_sync_errors.inc()
                continue
            t = asyncio.ensure_future(self._post(url, body))
            self._inflight.add(t)
            t.add_done_callback(self._inflight.discard)

    async def _post(self, url: str, body: bytes) -> None:
        import aiohttp
        try:
            async with self.session.post(url + PATH, data=body, timeout=aiohttp.ClientTimeout(
                    total=2.0), headers={"content-type": "application/json",
                                         "x-anchorage-internal": self.token}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
            self.sent += 1
        except Exception as exc:  # noqa: BLE001 - the next push carries on
            self.errors += 1
            self.state.metrics.peer_sync_errors.inc()
            log.debug("decision push to %s failed: %s", url, exc)

    # -- receiving ---------------------------------------------------------------------
    def authorised(self, given: str) -> bool:
        return bool(self.token) and hmac.compare_digest(given.encode(), self.token.encode())

    def parse(self, raw: bytes) -> tuple[str, bytes | None, dict[str, int]] | None:
        """(origin, batch bytes, load) of a received push; None for one's own pod.
        Raises ValueError when malformed."""
        if len(raw) > MAX_BATCH_BYTES:
            raise ValueError("decision batch too large")
        doc = fastjson.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("origin"), str):
            raise ValueError("a push is an object with an origin")
        if doc.get("pod") == self.pod:
            return None
        load = doc.get("load") or {}
        if not (isinstance(load, dict) and all(isinstance(k, str) and isinstance(v, int)
                                               for k, v in load.items())):
            raise ValueError("load is {url: count}")
        batch = doc.get("batch") or []
        payload = fastjson.dumps(batch) if batch else None
        if payload:
            decode(payload)                       # validates every decision
        self.received += 1
        return doc["origin"], payload, load

    def status(self) -> dict[str, Any]:
        return {"pod": self.pod, "peers": list(self.urls), "sent": self.sent,
                "received": self.received, "errors": self.errors}
