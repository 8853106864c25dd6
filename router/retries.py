"""Step 5 of a request: send it to a replica, and decide what a failure means.

Rules (a request that killed a replica must never be replayed onto the next one, and a
request's own failure must not eject healthy replicas):

- connect error or connect timeout: the request never reached the replica; it is sent
  to another one (up to ``retries`` times) and counts as a transport failure there;
- the replica answered, whatever the status: the answer goes to the client with its
  status and body (an engine's own 4xx/5xx, e.g. chat on a model without a chat
  template, or the 500 of an engine the request killed). Never retried, never a
  replica failure;
- the connection broke after the request was sent (the replica died under it, or the
  request itself crashed or failed the engine) before any byte went to the client, or a
  non-streaming answer whose every choice ended with ``finish_reason: abort`` (vLLM aborts
  the requests in flight when its engine shuts down, and answers 200 with nothing
  generated): the request is replayed once on another replica (retry reason
  ``connection_lost`` / ``aborted``; a killed engine loses no request). Who is at fault
  is decided by the replay: served there, the first replica is charged a transport
  failure (``state.charge``); failing the same way there too, it is the request's fault:
  the client gets a 502 error object (a second abort: the answer as it is), nothing is
  retried further, and neither replica is charged (ejection needs failures of distinct
  requests that succeed elsewhere: a client looping on a request that crashes engines
  ejects none). With no other replica to replay on, the same 502, uncharged. The replay
  goes over a new connection: an engine that closes its connection after an answer
  (vLLM's server does after an error it did not handle, e.g. chat without a tokenizer)
  leaves a pooled connection that fails the next request sent on it, and a valid request
  meeting two of those was a 502. A request that fails that way on a pooled connection
  before any answer is first sent again at once to the same replica over a new connection
  (retry reason ``stale_connection``), within the same attempt: no replica is charged
  for a connection the server had closed;
- read timeout: 504, counted as a transport failure, not replayed (the replica may still
  be computing it).

Every attempt ends in exactly one ``finish`` (cancellation included: a client that gives
up frees its slot at once), and every request in one ``requests_total`` sample: its last
attempt's outcome (``Tally``; ``core.handle`` counts those that reach no replica).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from starlette.responses import Response

from anchorage.router import errors, fastjson, relay
from anchorage.router.parsing import Parsed

CONNECT_ERRORS = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
READ_TIMEOUTS = (aiohttp.SocketTimeoutError, asyncio.TimeoutError)
BROKEN = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError,
          aiohttp.ClientConnectionError)


class Tally:
    """One request's line in ``anchorage_router_requests_total``: the replica and outcome
    of its last attempt (``replica`` None: it reached none), counted once when the request
    ends (``core.handle``; a stream's when its relay ends)."""

    __slots__ = ("replica", "model", "outcome", "deferred")

    def __init__(self) -> None:
        self.replica: int | None = None
        self.model: str | None = None
        self.outcome: str | None = None
        self.deferred = False          # a stream: its relay counts it


async def send(core, p: Parsed, ctx, tpk: float, fwd: bytes, headers: dict,
               tally: Tally | None = None) -> Any:
    state, cfg = core.state, core.cfg
    tally = tally if tally is not None else Tally()
    tried: list[int] = []
    suspect: int | None = None       # the replica that dropped this request, not yet charged
    connect_failures = 0
    last_error = "no replica"
    prefer = core.pinned(p)
    while True:
        d = state.pick(ctx, tried, tpk, p.model, prefer)
        prefer = None
        if d["status"] == "saturated":
            raise errors.saturated(d["retry_after_s"])
        if d["status"] == "no_model":
            raise errors.model_not_found(p.model or "")
        if d["status"] != "ok":
            if suspect is not None:  # dropped once, nowhere to replay: not charged
                raise dropped(1)
            raise errors.unavailable(f"no healthy replica could serve the request ({last_error})")
        rid, url = d["replica"], d["url"]
        tried.append(rid)
        outcome, answer = await attempt(core, p, ctx, rid, url, d["predicted_tokens"], fwd,
                                        headers, tally, fresh=suspect is not None)
        if outcome in ("aborted", "upstream_error"):
            if suspect is None:
                suspect = rid
                state.retried(url, "aborted" if outcome == "aborted" else "connection_lost")
                last_error = "aborted by the replica" if outcome == "aborted" else "connection lost"
                continue
            # the same failure on a second replica: the request's fault (nobody charged)
            if answer is not None:
                return answer            # the second abort goes to the client as it is
            raise dropped(2)
        if suspect is not None and outcome in ("answered", "ok"):
            state.charge(suspect)        # served elsewhere: the first replica failed it
            suspect = None
        if answer is not None:
            return answer
        if outcome == "connect_error" and connect_failures < cfg.retries:
            connect_failures += 1
            state.retried(url, "connect")
            last_error = "connect error"
            continue
        if outcome == "timeout":
            raise errors.RouterError(504, "the replica did not answer in time", "timeout",
                                     "upstream_timeout", reason="upstream_timeout")
        raise errors.unavailable(f"no healthy replica could serve the request ({last_error})")


def dropped(replicas: int) -> errors.RouterError:
    """The answer to a request whose connection the replica(s) dropped without answering."""
    where = "two replicas each" if replicas == 2 else "the replica"
    return errors.RouterError(502, f"{where} dropped the connection while serving this "
                              "request (it may crash or fail the engine); not retried further",
                              "upstream_error", "upstream_error", reason="upstream_error")


def aborted(content: bytes) -> bool:
    """Every choice of a (non-streaming) answer ended with ``finish_reason: abort``."""
    try:
        doc = fastjson.loads(content)
    except (ValueError, RecursionError):
        return False
    choices = doc.get("choices") if isinstance(doc, dict) else None
    return isinstance(choices, list) and bool(choices) and all(isinstance(c, dict) and c.get("finish_reason") == "abort"
                                 for c in choices)


async def attempt(core, p: Parsed, ctx, rid: int, url: str, predicted: int, fwd: bytes,
                  headers: dict, tally: Tally, fresh: bool = False) -> tuple[str, Any]:
    """(outcome, response or None when the caller should decide on a retry). The attempt's
    end goes to the routing state once (``finish``, not counted per attempt) and to
    ``tally``; a stream's end, from its relay, is counted there."""
    state = core.state
    finished = False
    tally.replica, tally.outcome = rid, None

    def done(outcome: str, usage: Any = None, charge: bool | None = None) -> None:
        nonlocal finished
        if not finished:
            finished = True
            tally.outcome = outcome
            state.finish(ctx, rid, outcome, usage, predicted, p.model, charge, count=False)
    try:
        try:
            session = core.fresh_session if fresh and core.fresh_session else core.session
            trace: dict = {}
            try:
                resp = await session.post(url + p.path, data=fwd, headers=headers,
                                          timeout=core.timeout, trace_request_ctx=trace)
            except BROKEN:
                if not trace.get("reused") or core.fresh_session is None:
                    raise
                state.retried(url, "stale_connection")     # the server had closed it
                resp = await core.fresh_session.post(url + p.path, data=fwd, headers=headers,
                                                     timeout=core.timeout)
        except CONNECT_ERRORS:
            done("connect_error")
            return "connect_error", None
        except READ_TIMEOUTS:
            done("timeout")
            return "timeout", None
        except BROKEN:
            done("upstream_error", charge=False)     # charged once served elsewhere
            return "upstream_error", None
        ctype = resp.headers.get("content-type", "application/json")
        if p.stream and resp.status < 400:
            finished = True            # the relay reports the end from here on
            tally.deferred = True

            def stream_end(o: str, u: Any) -> None:     # once: the relay's end, or unsent
                if tally.outcome is None:
                    tally.outcome = o
                    state.finish(ctx, rid, o, u, predicted, p.model, False)   # counted
            return "ok", relay.RelayResponse(
                relay.relay_stream(resp, stream_end, lambda: state.first_byte(ctx, rid),
                                   p.path != "/v1/responses"),
                status_code=resp.status, media_type=ctype,
                on_close=lambda: (stream_end("cancelled", None), resp.release()))
        try:
            content = await resp.read()
        except READ_TIMEOUTS:
            done("timeout")
            return "timeout", None
        except BROKEN:
            done("upstream_error", charge=False)
            return "upstream_error", None
        finally:
            resp.release()
        status = resp.status
        if status == 200 and b'"abort"' in content and aborted(content):
            done("upstream_error", charge=False)
            return "aborted", Response(content, status_code=status, media_type=ctype)
        usage = answer_id = None
        if status < 400 and (p.path == "/v1/responses" or b'"usage"' in content):
            usage, answer_id = fastjson.usage_and_id(content)   # parsed once, these fields only
        done("ok" if status < 400 else "client_error" if status < 500 else "server_error",
             usage if isinstance(usage, dict) else None)
        if answer_id is not None and p.path == "/v1/responses":
            core.remember_response(answer_id, url)
        return "answered", Response(content, status_code=status, media_type=ctype)
    except BaseException:
        done("cancelled")              # the client left (or anything unforeseen)
        raise
