"""Step 6 of a request: relay the replica's answer to the client.

Non-streaming answers are read whole and passed through with the replica's status and
content type (``usage`` is read for the predicted-vs-observed metrics only when present).
Streams pass through chunk by chunk; a stream that breaks after its first byte cannot be
retried, so it ends with an SSE ``error`` event in OpenAI's shape. The body generator
always reports the attempt's end (``finish``) exactly once, whether the stream ends,
breaks, or the client leaves (``RelayResponse`` closes it even then).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import aiohttp
from starlette.responses import StreamingResponse

from anchorage.router import fastjson
from anchorage.router.errors import error_body

log = logging.getLogger("anchorage.router")
SSE_ERROR = (b"data: " + error_body("the replica failed mid-stream", "upstream_error",
                                    "upstream_error") + b"\n\n")


class RelayResponse(StreamingResponse):
    """A streamed answer whose body generator is always closed when the response ends.

    Starlette stops iterating the body when the client disconnects but never closes it, so
    the generator's ``finally`` (which frees the replica in the routing state) would wait
    for the garbage collector; a cancelled generator sits in a reference cycle, so that can
    take arbitrarily long and leaves the replica counted as busy."""

    def __init__(self, *args, on_close=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            # a body never started (the client left before the response began) runs no
            # ``finally`` of its own: the attempt still ends, once (``on_close``)
            if self.on_close is not None:
                self.on_close()


_RelayResponse = RelayResponse     # the name tests and older code import


def usage_from_sse(buf: bytes) -> dict | None:
    usage = None
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {") and b'"usage"' in line:
            try:
                u, _ = fastjson.usage_and_id(line[6:])
            except ValueError:
                continue
            if isinstance(u, dict) and u:
                usage = u
    return usage


async def relay_stream(resp: aiohttp.ClientResponse, done: Callable[[str, Any], None],
                       on_first: Callable[[], None], needs_done_marker: bool):
    """Yield the replica's stream; ``done(outcome, usage)`` once at the end."""
    tail = b""
    outcome = "ok"
    first = True
    try:
        async for chunk in resp.content.iter_any():
            if first:      # the first token: its prompt left the replica's queue
                first = False
                on_first()
            tail = (tail + chunk)[-8192:]
            yield chunk
        if needs_done_marker and b"[DONE]" not in tail:
            outcome = "upstream_error"
    except (aiohttp.ClientError, asyncio.TimeoutError):
        outcome = "upstream_error"
    except (GeneratorExit, asyncio.CancelledError):
        outcome = "cancelled"          # the client went away: not the replica's fault
        raise
    finally:
        # account first: the replica is freed even if closing the upstream stalls
        done(outcome, usage_from_sse(tail))
        resp.release()
    if outcome != "ok":
        yield SSE_ERROR
