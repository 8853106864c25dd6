"""A small OpenAI-compatible upstream for fault injection (aiohttp, loopback only).

It keeps a toy prefix cache (token-id blocks it has seen) so ``cached_tokens`` in
``usage.prompt_tokens_details`` is meaningful. ``mode`` switches behaviour at run time:
``ok``, ``error500`` (every completion answers 500), ``slow`` (waits ``delay_s`` before the
first byte; a request whose connection closes meanwhile is recorded in ``aborted``), ``slow_stream`` (waits ``delay_s`` after each chunk), ``die_midstream`` (streams
two chunks, then drops the connection), ``poison`` (a request whose prompt holds a token id
>= 1024 answers 500 and stops the server, as a vLLM engine that skipped tokenizer
initialisation dies), ``reset`` (drops the connection without answering), ``drop_marked``
(drops the connection without answering for a request whose prompt holds token id 999, as
an engine that a request crashes or fails; others are served), ``stale`` (a connection
that carried an answer drops the next request sent on it, as a server that closed it
right after answering: vLLM's after an error it did not handle), ``abort``
(answers a non-streaming completion 200 with nothing generated and ``finish_reason:
abort``, as vLLM does for the requests in flight when its engine shuts down). ``models`` is
what ``/v1/models`` lists; ``kill()`` drops every open connection at once.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web


class FakeUpstream:
    def __init__(self, name: str, block_size: int = 16) -> None:
        self.name = name
        self.block_size = block_size
        self.mode = "ok"
        self.delay_s = 0.0
        self.requests: list[dict] = []
        self.aborted: list[dict] = []      # slow requests whose connection closed first
        self.cached: set = set()
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.models = ["tiny"]
        self._transports: set = set()
        self._answered: set = set()        # ``stale``: transports that carried an answer

    def _cached_tokens(self, body: dict) -> tuple[int, int]:
        prompt = body.get("prompt")
        if isinstance(prompt, str) or prompt is None:
            text = prompt if isinstance(prompt, str) else json.dumps(body.get("messages"))
            prompt = list(text.encode())
        salt = body.get("cache_salt")
        n = 0
        hit = True
        bs = self.block_size
        for i in range(len(prompt) // bs):
            key = (salt, tuple(prompt[: (i + 1) * bs]))
            if hit and key in self.cached:
                n += bs
            else:
                hit = False
                self.cached.add(key)
        return n, len(prompt)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self._transports.add(request.transport)
        body = await request.json()
        self.requests.append(body)
        if self.mode == "error500":
            return web.json_response({"error": {"message": "injected", "type": "InternalServerError",
                                                "param": None, "code": 500}}, status=500)
        if self.mode == "poison" and any(isinstance(t, int) and t >= 1024
                                         for t in body.get("prompt") or []):
            asyncio.get_running_loop().call_later(0.05, lambda: asyncio.ensure_future(self.kill()))
            return web.json_response({"error": {"message": "EngineCore died: index out of range",
                                                "type": "InternalServerError"}}, status=500)
        if self.mode == "stale":
            if request.transport in self._answered:
                request.transport.close()
                return web.Response()
            self._answered.add(request.transport)
        if self.mode == "reset" or (self.mode == "drop_marked"
                                    and 999 in (body.get("prompt") or [])):
            request.transport.close()
            return web.Response()
        if self.mode == "abort" and not body.get("stream"):   # vLLM shutting down
            return web.json_response({"id": "cmpl-x", "object": "text_completion",
                                      "model": body.get("model"), "choices": [
                                          {"index": 0, "text": "", "finish_reason": "abort"}],
                                      "usage": None})
        if body.get("model") not in (None, *self.models):
            return web.json_response({"error": {"message": f"The model `{body.get('model')}` "
                                                "does not exist.", "type": "NotFoundError",
                                                "param": "model", "code": 404}}, status=404)
        if self.mode == "slow" and await self._wait_or_abort(request):
            self.aborted.append(body)          # the router closed the connection: abort
            return web.Response(status=499)
        cached, prompt_tokens = self._cached_tokens(body)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 3,
                 "total_tokens": prompt_tokens + 3,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            choice = ({"message": {"role": "assistant", "content": "abc"}} if chat
                      else {"text": "abc"})
            return web.json_response({"id": f"{self.name}-{len(self.requests)}",
                                      "served_by": self.name, "choices": [choice],
                                      "usage": usage})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i, tok in enumerate("abc"):
            delta = {"delta": {"content": tok}} if chat else {"text": tok}
            chunk = {"id": self.name, "served_by": self.name, "choices": [delta]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if self.mode == "slow_stream":
                await asyncio.sleep(self.delay_s)
            if self.mode == "die_midstream" and i == 1:
                await asyncio.sleep(0.05)
                request.transport.close()
                return resp
        final = {"id": self.name, "served_by": self.name, "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def _wait_or_abort(self, request: web.Request) -> bool:
        """Wait ``delay_s``; True as soon as the client closes the connection (vLLM aborts
        such a request)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.delay_s
        while loop.time() < end:
            await asyncio.sleep(min(0.05, max(0.0, end - loop.time())))
            t = request.transport
            if t is None or t.is_closing():
                return True
        return False

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting{engine=\"0\"} 0.0\n"
                                 "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n")

    async def list_models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"}
                                                             for m in self.models]})

    async def kill(self) -> None:
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()
        for t in list(self._transports):
            t.abort() if hasattr(t, "abort") else t.close()
        self._transports.clear()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()

    async def start(self, port: int = 0) -> int:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_post("/v1/responses", self.completions)
        app.router.add_post("/tokenize", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.list_models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port or self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
