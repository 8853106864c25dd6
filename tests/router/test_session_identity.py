"""Agent clients' own session identity through the router's real request path (issue 41):
``anchorage router --hosting process`` (the router's request pipeline in one process, no
Ray) in front of two fake OpenAI-compatible upstreams on loopback. Claude Code's
``x-claude-code-session-id``, Codex's ``session_id`` header and ``prompt_cache_key``,
OpenCode's ``x-session-affinity`` keep a session on one replica and reach the engine as its
``session_id``; two tenants using the same identifier are two sessions."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp

from tests.router.fake_upstream import FakeUpstream
from tests.router.test_hosting_process import wait_ready
from tests.support.procs import free_port

BLOCK = 16


def _prompt(turn: int) -> list[int]:
    """A different first block every turn: without a session id the `session` policy keys
    a request by its tenant and first block, so these would not stay together."""
    return [(turn * 37 + i) % 1000 for i in range(BLOCK * 2)]


async def _run(tmp_path, check) -> None:
    ups = [FakeUpstream("a", block_size=BLOCK), FakeUpstream("b", block_size=BLOCK)]
    ports = [await u.start() for u in ups]
    port = free_port()
    argv = [sys.executable, "-m", "anchorage.cli", "router", "--hosting", "process",
            "--policy", "session", "--block-size", str(BLOCK), "--port", str(port),
            "--replicas", ",".join(f"http://127.0.0.1:{p}" for p in ports)]
    env = {**os.environ, "ANCHORAGE_TENANT_SECRET": "s" * 32}
    log = tmp_path / "router.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(url, proc, log)
        async with aiohttp.ClientSession() as s:
            async def send(turn: int, *, key="sk-alice", headers=None, **body):
                """One completion; (the upstream that served it, the body it received)."""
                before = [len(u.requests) for u in ups]
                async with s.post(url + "/v1/completions", json={
                        "model": "tiny", "prompt": _prompt(turn), "max_tokens": 2, **body},
                        headers={"authorization": f"Bearer {key}", **(headers or {})}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                (i,) = [i for i, u in enumerate(ups) if len(u.requests) > before[i]]
                return i, ups[i].requests[-1]
            await check(send)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for u in ups:
            await u.stop()


def test_agent_clients_sessions_stay_on_one_replica_and_reach_the_engine(tmp_path):
    async def check(send):
        clients = {
            "claude-code": dict(headers={"x-claude-code-session-id": "0d4c-claude"}),
            "codex-header": dict(headers={"session_id": "019a-codex"}),
            "codex-body": dict(prompt_cache_key="019b-codex"),
            "opencode": dict(headers={"x-session-affinity": "ses_opencode"}),
        }
        want = {"claude-code": "0d4c-claude", "codex-header": "019a-codex",
                "codex-body": "019b-codex", "opencode": "ses_opencode"}
        for name, how in clients.items():
            served = set()
            for turn in range(12):
                i, body = await send(turn, **how)
                served.add(i)
                # the engine sees the session (the node agent's eviction and tiering key)
                assert body["session_id"] == want[name], (name, body)
            assert len(served) == 1, (name, served)
        # the control: the same turns without any session identity spread over both
        assert len({(await send(t))[0] for t in range(16)}) == 2
    asyncio.run(_run(tmp_path, check))


def test_two_tenants_with_one_session_id_are_two_sessions(tmp_path):
    """The router keys a session by (tenant, id): an identifier another tenant also sends
    does not pull its requests after the first tenant's (each pair of tenants' sessions is
    placed on its own; with 24 shared ids, all landing together would be chance 2^-24)."""
    async def check(send):
        placed = {}
        for k in range(24):
            for key in ("sk-alice", "sk-bob"):
                homes = {(await send(t, key=key, prompt_cache_key=f"shared-{k}"))[0]
                         for t in range(2)}
                assert len(homes) == 1           # each tenant's session stays together
                placed[key, k] = homes.pop()
        assert any(placed["sk-alice", k] != placed["sk-bob", k] for k in range(24)), placed
    asyncio.run(_run(tmp_path, check))
