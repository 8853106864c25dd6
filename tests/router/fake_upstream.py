"""A small OpenAI-compatible upstream for fault injection (aiohttp, loopback only).

It keeps a toy prefix cache (token-id blocks it has seen) so ``cached_tokens`` in
``usage.prompt_tokens_details`` is meaningful. ``mode`` switches behaviour at run time:
``ok``, ``error500`` (every completion answers 500), ``slow`` (waits ``delay_s`` before the
first byte), ``slow_stream`` (waits ``delay_s`` after each chunk), ``die_midstream`` (streams two chunks, then drops the connection).
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
        self.cached: set = set()
        self.runner: web.AppRunner | None = None
        self.port = 0

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
        body = await request.json()
        self.requests.append(body)
        if self.mode == "error500":
            return web.json_response({"error": {"message": "injected"}}, status=500)
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
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

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting{engine=\"0\"} 0.0\n"
                                 "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def start(self, port: int = 0) -> int:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
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
