"""The sidecar sends the temporal controller's reload warm-ups over HTTP (fake engine on
loopback, snapshots written by the real exporter): at ``at_s`` and not before, once, with
the session's prompt, id and cache salt; the tiering counters reach /metrics."""

from __future__ import annotations

import asyncio
import time

import httpx
from anchorage.node_agent.state import NodeState, PolicyStateExporter

from anchorage.policies.base import EvictionPolicy, RequestContext
from tests.node_agent.test_sidecar import env, make, metric, until  # noqa: F401 (fixture)

TOKS = list(range(5, 45))


def test_the_sidecar_sends_a_due_reload_once_with_the_sessions_prompt(env):  # noqa: F811
    eng, tmp = env
    st = NodeState(block_size=4)
    ctx = RequestContext(request_id="r1", keys=(), input_length=len(TOKS), session_id="s1",
                         tool_name="pytest", tenant="t1")
    st.observe(EvictionPolicy(), ctx, TOKS, None, "salt-1")  # the plugin saw the session's turn
    at = time.time() + 0.6
    view = {"policy": "lru", "predictability": 0.0, "predictions": [], "block_size": 4,
            "tiering": {"mode": "temporal", "reserved_blocks": {},
                        "offloads": {"ok": 1, "stall_short": 2}, "reloads": {"late": 1},
                        "bytes": {"d2h": 4096, "h2d": 0},
                        "pending_reloads": [{"id": "s1#7", "session": "s1", "at_s": at,
                                             "blocks": 10, "agent": "coder", "tenant": "t1"}]}}
    exp = PolicyStateExporter(lambda: view, tmp / "state.json", interval_s=0.05,
                              node_state=st, policy_name="lru")

    async def main():
        sc = make(tmp, eng)
        await sc.start()
        exp.start()
        loop = asyncio.create_task(sc.run_loop())
        try:
            await until(lambda: sc.snapshot is not None and sc.ticks >= 3, "a snapshot")
            assert time.time() < at and eng.completions == []  # not before at_s
            await until(lambda: len(eng.completions) == 1, "the reload warm-up")
            assert time.time() >= at
            body = eng.completions[0]
            assert body == {"model": "tiny", "prompt": TOKS, "max_tokens": 1,
                            "session_id": "s1", "cache_salt": "salt-1",
                            "vllm_xargs": {"anchorage.warmup": 1, "anchorage.agent": "coder",
                                           "anchorage.tenant": "t1"}}
            await asyncio.sleep(0.3)
            assert len(eng.completions) == 1 and sc.reload_warmups["issued"] == 1  # once
            async with httpx.AsyncClient() as c:
                text = (await c.get(f"http://127.0.0.1:{sc.port}/metrics")).text
            assert metric(text, "anchorage_tiering_offloads_total", decision="ok") == 1
            assert metric(text, "anchorage_tiering_offloads_total", decision="stall_short") == 2
            assert metric(text, "anchorage_tiering_bytes_total", direction="d2h") == 4096
        finally:
            exp.stop()
            sc.request_stop()
            await loop
            await sc.stop()

    asyncio.run(main())
