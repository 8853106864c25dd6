"""The node agent's BlockPool patch, on vLLM 0.32's real KV cache manager (no engine).

Two managers take the same randomized agent-like request sequence: one stock, one whose
pool is driven by a policy through the patch. Under ``lru`` they must agree after every
step, block for block (hits, block ids, the whole free queue); under a different order
the patch must really change the victims while vLLM's own accounting stays intact; a
policy that raises or names invalid victims must leave serving unaffected (stock
decisions) and be counted.
"""

from __future__ import annotations

import logging
import random

import pytest

from anchorage.policies.base import EvictionPolicy
from anchorage.policies.lru import LRUPolicy
from tests.pool.vllm_side import VllmSide, vllm_kv  # noqa: F401 (fixture)
from tests.pool.workload import agent_workload, token_blocks


@pytest.fixture(scope="module")
def patch(vllm_kv):
    from types import SimpleNamespace

    from anchorage.node_agent import vllm_block_pool, vllm_hooks

    assert vllm_hooks.unsupported_reason() is None
    vllm_hooks.install(None)  # classes patched; pools get a driver only when attached
    return SimpleNamespace(attach=vllm_block_pool.attach, driver=vllm_block_pool.driver,
                           stats=lambda: vllm_block_pool.STATS, install=vllm_hooks.install,
                           unsupported_reason=vllm_hooks.unsupported_reason)


class MRUPolicy(LRUPolicy):
    """The opposite order (most recently freed first): victims must differ from stock."""

    name = "mru"

    def pop_victim(self):
        q = self._queue
        return q.popitem(last=True)[0] if q else None

    def eviction_order(self):
        return list(reversed(self._queue))


class RaisingPolicy(LRUPolicy):
    name = "raising"

    def pop_victim(self):
        raise RuntimeError("injected policy failure")


class LiarPolicy(LRUPolicy):
    """Names a block that is in use (or block 0, vLLM's null block) as a victim."""

    name = "liar"

    def __init__(self):
        super().__init__()
        self.calls = 0

    def pop_victim(self):
        self.calls += 1
        return 0 if self.calls % 2 else 10**6


def drive(v, sides, seed, block_size, capacity, n_requests=100, max_running=4,
          check=None):
    """The same admit / decode / free sequence on every side; returns hits per side."""
    rng = random.Random(seed)
    reqs = agent_workload(rng, block_size, n_requests)
    tokens_of = token_blocks(rng, block_size)
    pending = list(reversed(reqs))
    running: dict[int, int] = {}
    hits = [[] for _ in sides]
    out_tok = 10_000_000
    step = 0
    while pending or running:
        step += 1
        if pending and len(running) < max_running and (rng.random() < 0.45 or not running):
            r = pending.pop()
            res = [s.admit(r, tokens_of(r.keys, r.prompt_len)) for s in sides]
            for h, x in zip(hits, res):
                h.append(x)
            assert len(set(x is None for x in res)) == 1, f"step {step}: admission differs"
            if res[0] is None:
                if running:
                    pending.append(r)
                    rid = rng.choice(list(running))
                    for s in sides:
                        s.free(rid)
                    del running[rid]
            else:
                running[r.rid] = r.output_len - 1
        else:
            rid = rng.choice(list(running))
            left = running[rid]
            if left > 0 and rng.random() < 0.9:
                n = left if rng.random() < 0.3 else 1
                toks = list(range(out_tok, out_tok + n))
                out_tok += n
                ok = [s.decode(rid, toks) for s in sides]
                assert len(set(ok)) == 1, f"step {step}: decode differs"
                if ok[0]:
                    running[rid] = left - n
                    continue
            for s in sides:
                s.free(rid)
            del running[rid]
        if check is not None:
            check(step, sides)
    return hits


def same_state(step, sides):
    a, b = sides
    assert a.free_queue() == b.free_queue(), f"step {step}: free queue differs"
    for rid in a.reqs:
        assert a.block_ids(rid) == b.block_ids(rid), f"step {step}: blocks of {rid} differ"


def consistent(step, sides):
    for s in sides:  # vLLM's own accounting: every block is either free (once) or held
        free = s.free_queue()
        assert len(free) == len(set(free)) == s.pool.get_num_free_blocks()
        assert all(s.pool.blocks[b].ref_cnt == 0 for b in free)
        held = {b for rid in s.reqs for b in s.block_ids(rid)}
        assert not held & set(free)
        assert len(held) + len(free) == s.pool.num_gpu_blocks - 1


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("block_size,capacity", [(4, 24), (16, 20), (2, 14)])
def test_lru_through_the_patch_is_stock_vllm(vllm_kv, patch, seed, block_size, capacity):
    stock = VllmSide(vllm_kv, capacity, block_size)
    driven = VllmSide(vllm_kv, capacity, block_size)
    driver = patch.attach(driven.pool, LRUPolicy())
    before = patch.stats().victims
    hits = drive(vllm_kv, [stock, driven], 100 + seed, block_size, capacity, check=same_state)
    assert hits[0] == hits[1]
    assert driver.errors == 0
    assert patch.stats().victims > before, "the policy chose no victim: the patch did nothing"


def test_another_order_changes_victims_not_correctness(vllm_kv, patch):
    stock = VllmSide(vllm_kv, 16, 4)
    driven = VllmSide(vllm_kv, 16, 4)
    driver = patch.attach(driven.pool, MRUPolicy())
    diverged = []

    def check(step, sides):
        consistent(step, sides)
        if sides[0].free_queue() != sides[1].free_queue():
            diverged.append(step)

    drive(vllm_kv, [stock, driven], 7, 4, 16, max_running=1, check=check)
    assert diverged, "a different policy order never changed vLLM's victims"
    assert driver.errors == 0


@pytest.mark.parametrize("policy_cls", [RaisingPolicy, LiarPolicy])
def test_policy_errors_fall_back_to_stock(vllm_kv, patch, policy_cls, caplog):
    stock = VllmSide(vllm_kv, 20, 4)
    driven = VllmSide(vllm_kv, 20, 4)
    driver = patch.attach(driven.pool, policy_cls())
    before = patch.stats().errors
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        hits = drive(vllm_kv, [stock, driven], 11, 4, 20, check=same_state)
    assert hits[0] == hits[1]  # every decision was stock: identical to stock vLLM
    assert driver.errors > 0 and patch.stats().errors - before == driver.errors
    warnings = [r for r in caplog.records if "stock vLLM behaviour" in r.getMessage()]
    assert len(warnings) == 1  # one warning, the rest counted


def test_notifications_carry_the_request(vllm_kv, patch):
    seen = {"hit": [], "cached": [], "freed": [], "request": [], "done": []}

    class Recorder(LRUPolicy):
        def on_request(self, ctx):
            seen["request"].append(ctx)

        def on_hit(self, ctx, blocks, were_free):
            seen["hit"].append((ctx.request_id, list(blocks)))
            super().on_hit(ctx, blocks, were_free)

        def on_cached(self, ctx, blocks, keys, start):
            seen["cached"].append((ctx.request_id, list(blocks), start))

        def on_freed(self, ctx, blocks):
            seen["freed"].append((ctx.request_id, list(blocks)))
            super().on_freed(ctx, blocks)

        def on_request_done(self, ctx):
            seen["done"].append(ctx.request_id)

    v = vllm_kv
    side = VllmSide(v, 20, 4)
    patch.attach(side.pool, Recorder())
    from tests.pool.workload import Req

    sp = v.SamplingParams(max_tokens=3, extra_args={"anchorage": {
        "agent": "planner", "tool_name": "grep", "tool_args": {"q": "x"}, "warmup": True,
        "tenant": "t1"}})
    toks = list(range(1, 14))
    req = v.Request("r1", toks, sp, None, block_hasher=side.hasher, session_id="sess-9")
    blocks, hit, _ = side.mgr.get_computed_blocks(req)
    assert side.mgr.allocate_slots(req, len(toks) - hit, hit, blocks) is not None
    side.mgr.free(req)
    again = side.admit(Req(2, [0, 1, 2, 3], 13, 2), toks)
    assert again == 12
    ctx = seen["request"][0]
    assert (ctx.request_id, ctx.session_id, ctx.agent_hint, ctx.tool_name, ctx.tool_args,
            ctx.warmup, ctx.tenant, ctx.input_length) == (
        "r1", "sess-9", "planner", "grep", {"q": "x"}, True, "t1", 13)
    assert len(ctx.keys) == 3 and all(isinstance(k, bytes) for k in ctx.keys)
    assert seen["cached"][0] == ("r1", [1, 2, 3], 0)
    assert seen["freed"][0] == ("r1", [3, 2, 1])  # tail first, the uncached block 4 not
    assert seen["done"] == ["r1"]
    assert seen["hit"][-1] == ("2", [1, 2, 3])


def test_register_stays_stock_when_off_or_unknown(monkeypatch, caplog, patch):
    from anchorage.node_agent import plugin

    monkeypatch.delenv("ANCHORAGE_POLICY", raising=False)
    assert plugin.register() is False
    monkeypatch.setenv("ANCHORAGE_POLICY", "off")
    assert plugin.register() is False
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        monkeypatch.setenv("ANCHORAGE_POLICY", "no-such-policy")
        assert plugin.register() is False
        monkeypatch.setenv("ANCHORAGE_POLICY", "belady")
        assert plugin.register() is False
    msgs = [r.getMessage() for r in caplog.records]
    assert any("not a known policy" in m for m in msgs)
    assert any("only in the simulator" in m for m in msgs)


def test_register_attaches_new_pools(monkeypatch, vllm_kv, patch):
    from anchorage.node_agent import plugin

    monkeypatch.setenv("ANCHORAGE_POLICY", "lru")
    try:
        assert plugin.register() is True
        side = VllmSide(vllm_kv, 10, 4)
        d = patch.driver(side.pool)
        assert d is not None and d.policy.name == "lru"
        assert d.view.capacity_blocks == 10 and d.view.block_size == 4
    finally:
        patch.install(None)
    assert patch.driver(VllmSide(vllm_kv, 10, 4).pool) is None


def test_unsupported_version_stays_stock(monkeypatch, patch):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    assert "not a supported version" in patch.unsupported_reason()


def test_base_policy_contract_still_holds():
    # the patch relies on these notifications existing with these names
    for name in ("on_request", "on_hit", "on_cached", "on_freed", "pop_victim", "on_evicted",
                 "on_request_done", "reset"):
        assert callable(getattr(EvictionPolicy, name))
