"""A client that drives the endpoint picker's ext_proc stream as Envoy does, with the
processing mode the Inference Extension's gateways configure (``request_header_mode:
SEND``, ``response_header_mode: SEND``, both body modes ``FULL_DUPLEX_STREAMED``;
llm-d-router ``config/charts/llm-d-router-standalone/values.yaml``):

- the request headers (HTTP/2-style lower-case names with the ``:method``/``:path``
  pseudo-headers, ``raw_value``), ``end_of_stream`` only when there is no body, and the
  subset hint in ``metadata_context`` when given;
- the body in chunks, without waiting for answers, the last one ``end_of_stream``;
- then it reads the EPP's answers: an ``ImmediateResponse`` ends the exchange; otherwise
  the request-headers answer (``x-gateway-destination-endpoint`` header mutation and
  ``envoy.lb`` dynamic metadata) and the streamed request body until ``end_of_stream``;
- the upstream's answer goes back as Envoy sends it: the response headers (``:status``,
  with ``envoy.lb`` / ``x-gateway-destination-endpoint-served`` in ``metadata_context``),
  then each response body chunk, whose echo is awaited before the next.

``forward(...)`` plays the gateway fully: it sends the rewritten request to the first
endpoint (HTTP, loopback) and feeds the real answer back through the stream.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from grpc.aio import EOF

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as epg
from google.protobuf import struct_pb2

ENDPOINT = "x-gateway-destination-endpoint"


def header_map(headers: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                       for k, v in headers.items()])


def metadata(ns: str, key: str, value: Any) -> base_pb2.Metadata:
    s = struct_pb2.Struct()
    s.update({key: value})
    m = base_pb2.Metadata()
    m.filter_metadata[ns].CopyFrom(s)
    return m


@dataclass
class Picked:
    immediate: ep.ImmediateResponse | None = None
    endpoint: str = ""                       # the header mutation's value
    metadata_endpoint: str = ""              # dynamic_metadata envoy.lb's value
    set_headers: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    clear_route_cache: bool = False
    body: bytes = b""
    body_chunks: int = 0
    response_body: bytes = b""
    response_status: int = 0

    @property
    def status(self) -> int:
        return self.immediate.status.code if self.immediate is not None else 0


class Exchange:
    """One ext_proc stream, step by step."""

    def __init__(self, stub: epg.ExternalProcessorStub) -> None:
        self.q: asyncio.Queue = asyncio.Queue()
        self.call = stub.Process(self._requests())
        self.picked = Picked()

    async def _requests(self):
        while True:
            m = await self.q.get()
            if m is None:
                return
            yield m

    async def send_request(self, headers: dict[str, str], body: bytes | None,
                           chunks: int = 3, subset: Any = None) -> Picked:
        md = (metadata("envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset", subset)
              if subset is not None else None)
        hdr = ep.HttpHeaders(headers=header_map(headers), end_of_stream=body is None)
        self.q.put_nowait(ep.ProcessingRequest(request_headers=hdr, metadata_context=md)
                          if md is not None else ep.ProcessingRequest(request_headers=hdr))
        if body is not None:
            n = max(1, chunks)
            size = -(-len(body) // n) if body else 0
            parts = [body[i:i + size] for i in range(0, len(body), size)] if body else [b""]
            for i, part in enumerate(parts):
                self.q.put_nowait(ep.ProcessingRequest(request_body=ep.HttpBody(
                    body=part, end_of_stream=i == len(parts) - 1)))
        p = self.picked
        while True:
            r = await self.call.read()
            if r is EOF:
                raise AssertionError("the EPP closed the stream without an answer")
            kind = r.WhichOneof("response")
            if kind == "immediate_response":
                p.immediate = r.immediate_response
                return p
            if kind == "request_headers":
                c = r.request_headers.response
                p.clear_route_cache = c.clear_route_cache
                for h in c.header_mutation.set_headers:
                    p.set_headers[h.header.key] = (h.header.raw_value.decode()
                                                   or h.header.value)
                p.removed = list(c.header_mutation.remove_headers)
                p.endpoint = p.set_headers.get(ENDPOINT, "")
                lb = r.dynamic_metadata.fields.get("envoy.lb")
                if lb is not None:
                    p.metadata_endpoint = lb.struct_value.fields[ENDPOINT].string_value
                if body is None:
                    return p
            elif kind == "request_body":
                sr = r.request_body.response.body_mutation.streamed_response
                p.body += sr.body
                p.body_chunks += 1
                if sr.end_of_stream:
                    return p
            else:
                raise AssertionError(f"unexpected answer before the body: {kind}")

    async def send_response(self, status: int, headers: dict[str, str], chunks: list[bytes],
                            served: str | None) -> Picked:
        md = metadata("envoy.lb", "x-gateway-destination-endpoint-served", served) if served else None
        h = {":status": str(status), **headers}
        msg = ep.ProcessingRequest(response_headers=ep.HttpHeaders(
            headers=header_map(h), end_of_stream=not chunks))
        if md is not None:
            msg.metadata_context.CopyFrom(md)
        self.q.put_nowait(msg)
        r = await self.call.read()
        assert r.WhichOneof("response") == "response_headers", r
        self.picked.response_status = status
        for i, c in enumerate(chunks):
            self.q.put_nowait(ep.ProcessingRequest(response_body=ep.HttpBody(
                body=c, end_of_stream=i == len(chunks) - 1)))
            while True:
                r = await self.call.read()
                assert r.WhichOneof("response") == "response_body", r
                sr = r.response_body.response.body_mutation.streamed_response
                self.picked.response_body += sr.body
                if sr.end_of_stream or i < len(chunks) - 1:
                    break
        return self.picked

    async def close(self) -> None:
        self.q.put_nowait(None)
        try:
            while await self.call.read() is not EOF:
                pass
        except Exception:  # noqa: BLE001 - the stream is over either way
            pass

    def cancel(self) -> None:
        self.call.cancel()


def request_headers(path: str = "/v1/completions", method: str = "POST",
                    **extra: str) -> dict[str, str]:
    return {":method": method, ":path": path, ":authority": "gateway", ":scheme": "http",
            "content-type": "application/json", **extra}


async def forward(stub, http, path: str, body: bytes, chunks: int = 3, subset: Any = None,
                  headers: dict[str, str] | None = None, use_fallback: bool = False) -> Picked:
    """One request through the EPP and on to the endpoint it picked (``http``: an aiohttp
    ClientSession), as a gateway does: the answer is fed back through the stream."""
    ex = Exchange(stub)
    try:
        p = await ex.send_request(request_headers(path, **(headers or {})), body, chunks, subset)
        if p.immediate is not None:
            return p
        eps = p.endpoint.split(",")
        target = eps[1] if use_fallback and len(eps) > 1 else eps[0]
        fwd = {k: v for k, v in p.set_headers.items() if not k.startswith("x-gateway")}
        async with http.post(f"http://{target}{path}", data=p.body, headers=fwd) as r:
            hdrs = {"content-type": r.headers.get("content-type", "")}
            out = []
            async for c in r.content.iter_any():
                out.append(c)
            await ex.send_response(r.status, hdrs, out or [b""], target)
        return p
    finally:
        await ex.close()
