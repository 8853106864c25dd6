"""The sidecar's client of its engine's OpenAI server: load from ``/metrics``, the served
model from ``/v1/models``, warm-ups through ``POST /v1/completions``."""

from __future__ import annotations

from typing import Any

from anchorage.prometheus_text import sums

ENGINE_LOAD = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_engine_load(text: str) -> tuple[int, int]:
    """(running, waiting) from vLLM's Prometheus text (summed over label sets)."""
    got = sums(text, ENGINE_LOAD)
    return int(got.get(ENGINE_LOAD[0], 0.0)), int(got.get(ENGINE_LOAD[1], 0.0))


class EngineClient:
    """``httpx.AsyncClient`` calls to ``url``; every method raises on a failure (the
    sidecar decides what a failure means)."""

    def __init__(self, url: str, request_timeout_s: float = 60.0):
        import httpx

        self.url = url
        self.request_timeout_s = request_timeout_s
        self._client = httpx.AsyncClient()

    async def load(self) -> tuple[int, int]:
        r = await self._client.get(self.url + "/metrics", timeout=5.0)
        r.raise_for_status()
        return parse_engine_load(r.text)

    async def model(self) -> str | None:
        """The first served model's name (None when it serves none)."""
        m = await self._client.get(self.url + "/v1/models", timeout=5.0)
        m.raise_for_status()
        data = m.json().get("data") or []
        return str(data[0]["id"]) if data else None

    async def complete(self, body: dict[str, Any]) -> None:
        resp = await self._client.post(self.url + "/v1/completions", json=body,
                                       timeout=self.request_timeout_s)
        resp.raise_for_status()

    async def aclose(self) -> None:
        await self._client.aclose()
