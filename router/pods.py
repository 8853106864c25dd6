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

Delivery: one push in flight per peer. Decisions made while it is in flight wait in that
peer's outbox and leave together in the next push (at most ``SEND_BYTES`` of batches
each), so a slow peer gets fewer, larger pushes and no decision is skipped. A push that
fails in transport (or times out, or a 5xx/408/429) is sent again after ``RETRY_S``; one
the peer refuses (another 4xx: a wrong token, a peer that does not share) is dropped.
An outbox holds at most ``MAX_PENDING_BYTES``; beyond it the oldest batches are dropped
(a peer down for long: its decisions are stale by then anyway).

Peers: a static list of router pod URLs (``peers``), or the ready addresses of the
router's own Service Endpoints found by label (``peer_selector``, the same Kubernetes
discovery as for engines), minus this pod's own address (``POD_IP``). Every failed push
and every dropped batch is counted (``anchorage_router_peer_sync_errors_total``); routing
never waits on a peer.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import deque
from typing import Any

from anchorage.router import fastjson
from anchorage.router.sync import decode

log = logging.getLogger("anchorage.router")
PATH = "/internal/v1/peer-decisions"
MAX_BATCH_BYTES = 8 << 20
REFRESH_INTERVALS = 5          # push load even without new decisions every N intervals
SEND_BYTES = 1 << 20           # batches per push (under the peer's max_body_bytes)
MAX_PENDING_BYTES = 4 << 20    # per peer; beyond it the oldest batches are dropped
TIMEOUT_S = 10.0               # one push; the next waits for it, nothing is lost meanwhile
RETRY_S = 0.5                  # after a failed push


class _Outbox:
    """What one peer has not received yet (batches as JSON arrays, the latest load)."""

    def __init__(self) -> None:
        self.batches: deque[bytes] = deque()
        self.size = 0
        self.origin = ""
        self.load: dict[str, int] = {}
        self.dirty = False              # something (decisions or load) to send
        self.task: asyncio.Future | None = None

    def take(self) -> list[bytes]:
        out: list[bytes] = []
        n = 0
        while self.batches and (not out or n + len(self.batches[0]) <= SEND_BYTES):
            out.append(self.batches.popleft())
            n += len(out[-1])
        self.size -= n
        return out

    def put_back(self, batches: list[bytes]) -> int:
        """Return unsent batches to the front; how many were dropped to stay bounded."""
        self.batches.extendleft(reversed(batches))
        self.size += sum(len(b) for b in batches)
        return self.trim()

    def trim(self) -> int:
        dropped = 0
        while self.size > MAX_PENDING_BYTES and len(self.batches) > 1:
            self.size -= len(self.batches.popleft())
            dropped += 1
        return dropped


def merge(batches: list[bytes]) -> bytes:
    """JSON arrays of decisions -> one array (their rows, in order)."""
    rows = [b[1:-1] for b in batches if len(b) > 2]
    return b"[" + b",".join(rows) + b"]"


class PodPeers:
    def __init__(self, state, session, token: str, pod: str, peers: list[str] | None = None,
                 own_ip: str = "") -> None:
        self.state, self.session, self.token, self.pod = state, session, token, pod
        self.own_ip = own_ip
        self.urls: list[str] = []
        self.outboxes: dict[str, _Outbox] = {}
        self.set_peers(peers or [])
        self.sent = self.received = self.errors = 0
        self._idle = 0

    def set_peers(self, urls: list[str]) -> None:
        own = f"//{self.own_ip}:" if self.own_ip else None
        self.urls = [u.rstrip("/") for u in urls if not (own and own in u)]
        for gone in set(self.outboxes) - set(self.urls):
            del self.outboxes[gone]          # its sender ends at its next turn

    # -- sending -----------------------------------------------------------------------
    def push(self, origin: str, payload: bytes | None, load: dict[str, int]) -> None:
        """Queue this interval's batch and load for every peer (never waits)."""
        if not self.urls or not self.token:
            return
        if payload is None:
            self._idle += 1
            if self._idle < REFRESH_INTERVALS and not load:
                return
        self._idle = 0
        for url in self.urls:
            box = self.outboxes.get(url)
            if box is None:
                box = self.outboxes[url] = _Outbox()
            if payload:
                box.batches.append(payload)
                box.size += len(payload)
                self._dropped(box.trim())
            box.origin, box.load, box.dirty = origin, load, True
            if box.task is None or box.task.done():
                box.task = asyncio.ensure_future(self._sender(url, box))

    async def _sender(self, url: str, box: _Outbox) -> None:
        """Send ``box`` to ``url`` until it is empty (one push in flight)."""
        while box.dirty and self.outboxes.get(url) is box:
            batches = box.take()
            box.dirty = bool(box.batches)
            body = (b'{"origin":' + fastjson.dumps(f"{self.pod}/{box.origin}") + b',"pod":'
                    + fastjson.dumps(self.pod) + b',"load":' + fastjson.dumps(box.load)
                    + b',"batch":' + merge(batches) + b"}")
            retry = await self._post(url, body)
            if retry and batches:
                self._dropped(box.put_back(batches))
                box.dirty = True
            if retry:
                box.dirty = True
                await asyncio.sleep(RETRY_S)

    def _dropped(self, n: int) -> None:
        if n:
            self.errors += n
            self.state.metrics.peer_sync_errors.inc(n)
            log.warning("dropped %d decision batches for a router pod that is not reading them", n)

    async def _post(self, url: str, body: bytes) -> bool:
        """One push; True when it should be sent again (transport failure, timeout,
        408/429/5xx), False when delivered or refused."""
        import aiohttp
        try:
            async with self.session.post(url + PATH, data=body, timeout=aiohttp.ClientTimeout(
                    total=TIMEOUT_S), headers={"content-type": "application/json",
                                               "x-anchorage-internal": self.token}) as r:
                await r.read()
                status = r.status
        except Exception as exc:  # noqa: BLE001 - sent again after RETRY_S
            self.errors += 1
            self.state.metrics.peer_sync_errors.inc()
            log.debug("decision push to %s failed: %s", url, exc)
            return True
        if status == 200:
            self.sent += 1
            return False
        self.errors += 1
        self.state.metrics.peer_sync_errors.inc()
        log.debug("decision push to %s answered HTTP %d", url, status)
        return status >= 500 or status in (408, 429)

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
                "received": self.received, "errors": self.errors,
                "pending": {u: len(b.batches) for u, b in self.outboxes.items()}}
