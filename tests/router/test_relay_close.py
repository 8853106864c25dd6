"""The router's streamed answer closes its body generator when the client leaves, so the
replica is freed at once rather than whenever the garbage collector finds the generator."""

from __future__ import annotations

import asyncio

from fastapi.responses import StreamingResponse

from anchorage.router.app import _RelayResponse


def _run(response_cls) -> list[str]:
    """Stream to a client that disconnects while the server is sending the first chunk
    (the body generator is then suspended at its ``yield``); return what the body's
    cleanup recorded by the time the response has ended."""
    events: list[str] = []
    sending = asyncio.Event()

    async def body():
        try:
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"
        finally:
            events.append("closed")

    async def receive():
        await sending.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message["body"]:
            sending.set()
            await asyncio.Event().wait()       # the client is gone: this send never completes

    async def main():
        resp = response_cls(body(), media_type="text/event-stream")
        await asyncio.wait_for(resp({"type": "http", "asgi": {}}, receive, send), 5)
        seen = list(events)                    # before asyncio.run's shutdown closes leftovers
        del resp
        return seen

    return asyncio.run(main())


def test_relay_response_closes_the_body_when_the_client_leaves():
    assert _run(_RelayResponse) == ["closed"]


def test_plain_streaming_response_leaves_the_body_open():
    # why _RelayResponse exists: starlette abandons the suspended generator
    assert _run(StreamingResponse) == []
