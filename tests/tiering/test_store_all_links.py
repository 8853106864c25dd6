"""The peers' host tier (``store-all``), host links shared by replicas, TokenCake's
published hold-on-rejection."""

import pytest

from anchorage.tiering.host_tier import HostTierConfig, Link
from anchorage.tiering.sim import TieringConfig, simulate_tiered
from anchorage.tiering.temporal import Decision, GateParams, stall_action
from tests.tiering.test_sim import cfg, workload


def test_store_all_copies_every_turn_incrementally_and_reloads_only_at_admission():
    recs, ctxs = workload()
    sim, r = simulate_tiered(recs, ctxs, cfg(), "lru", "session",
                             tiering=TieringConfig(mode="store-all"))
    assert r["offloads"] > 0 and r["host_hit_blocks"] > 0
    assert r["demoted_evictions"] == 0          # the GPU order stays the policy's
    # no warm-up: every reload is one a request asked for at admission
    assert r["reloads"] == r["demand_reloads"]
    # incremental: a block host memory holds is not copied again (100 GB: never full);
    # only copies still in flight at the next turn end or at the run's end repeat
    held = sum(len(rep.tiering.host.keys) for rep in sim.replicas)
    assert held <= r["offload_blocks"] <= 1.02 * held
    assert r["prefill_tokens"] == r["hit_tokens"] + r["host_hit_tokens"] + r["recomputed_tokens"]


def test_replicas_behind_one_link_share_its_queue_and_bytes_count_once():
    recs, ctxs = workload()
    sim, r = simulate_tiered(recs, ctxs, cfg(), "lru", "session",
                             tiering=TieringConfig(mode="store-all"), replicas_per_link=2)
    a, b = (rep.tiering.host for rep in sim.replicas)
    assert a.d2h is b.d2h and a.h2d is b.h2d
    assert r["offload_bytes"] == a.d2h.bytes
    assert r["tiering"]["replicas_per_link"] == 2
    _, own = simulate_tiered(recs, ctxs, cfg(), "lru", "session",
                             tiering=TieringConfig(mode="store-all"))
    assert own["tiering"]["replicas_per_link"] == 1
    with pytest.raises(ValueError):
        simulate_tiered(recs, ctxs, cfg(), "lru", "session",
                        tiering=TieringConfig(mode="store-all"), replicas_per_link=0)


def test_a_shared_link_is_fifo_across_its_replicas():
    link = Link(1e9, 0.0)
    assert link.schedule(0.0, 1e9) == pytest.approx(1.0)   # replica A's copy
    assert link.schedule(0.5, 1e9) == pytest.approx(2.0)   # replica B's queues behind
    assert HostTierConfig().capacity_blocks(2 << 20) == int(100e9 // (2 << 20))


def test_tokencake_as_published_holds_every_rejected_stall():
    rejected = Decision(False, "no_fit", 1.0)
    assert stall_action(rejected, 10.0, 1.0) == "backup"                 # Anchorage's
    assert stall_action(rejected, 10.0, 1.0, GateParams(hold_rejected=True)) == "hold"
    assert stall_action(Decision(False, "host_full", 1.0), 10.0, 1.0,
                        GateParams(hold_rejected=True)) == "hold"
    assert stall_action(Decision(True, "ok", 1.0), 10.0, 1.0,
                        GateParams(hold_rejected=True)) == "offload"


@pytest.mark.parametrize("mode,orders", [("store-all", "admission"), ("offload", "admission"),
                                         ("tokencake", "spatial")])
def test_the_replicas_admission_order_stands_unless_the_tier_has_its_own(monkeypatch, mode,
                                                                         orders):
    """A host tier without a spatial reservation leaves the waiting queue to the replica's
    ``admission`` (prefix-aware here), as the engine's scheduler does under the offloading
    connector; before, any tier silently replaced it with FCFS."""
    from dataclasses import replace

    from anchorage.sim import queues

    calls = []
    real = queues.order_prefix_aware
    monkeypatch.setattr(queues, "order_prefix_aware",
                        lambda rep, now: (calls.append(now), real(rep, now))[1])
    recs, ctxs = workload()
    c = replace(cfg(cap=300), admission="prefix-aware")
    simulate_tiered(recs, ctxs, c, "lru", "session", tiering=TieringConfig(mode=mode))
    assert bool(calls) == (orders == "admission"), (mode, len(calls))


@pytest.mark.parametrize("mode", ["off", "store-all", "offload"])
def test_the_router_sees_which_replicas_keep_a_host_tier(mode):
    recs, ctxs = workload()
    sim, _ = simulate_tiered(recs, ctxs, cfg(), "lru", "agent", tiering=TieringConfig(mode=mode))
    # the views every routing decision was handed (ClusterSim.views, updated in place)
    assert sim.views and all(v.host_tier == (mode != "off") for v in sim.views)


def test_host_tiers_publish_cpu_events_that_tier_aware_routers_index():
    """vLLM 0.32's offloading connector publishes its CPU tier's stores and drops
    (``medium`` CPU): the router's CPU index is, at the end of the run, what each replica's
    host tier holds (a small host tier, so its LRU drops too), and its GPU index ignores
    them."""
    from anchorage.tiering.host_tier import HostTier

    recs, ctxs = workload()
    host = HostTierConfig(capacity_bytes=400 * (2 << 20))   # 400 blocks of 2 MiB
    sim, r = simulate_tiered(recs, ctxs, cfg(), "lru", "llm_d",
                             tiering=TieringConfig(mode="store-all", host=host))
    scorer = sim.router.scorers[0][1]
    assert any(rep.tiering.host.dropped_blocks for rep in sim.replicas)
    for rep in sim.replicas:
        held = set(rep.tiering.host.keys)
        assert held and set(scorer.index.lower["CPU"]._lru.get(rep.index, ())) == held
        assert set(scorer.index.device._lru.get(rep.index, ())) <= set(rep.pool.cached)
    # in the order they happen, runs of one kind merged
    h = HostTier(HostTierConfig(capacity_bytes=2 * (2 << 20)), 2 << 20)
    h.events = []
    h.store(["a", "b"])
    h.store(["c", "d"])
    assert [(type(e).__name__, list(e.keys), e.medium) for e in h.events] == [
        ("BlockStored", ["a", "b"], "CPU"), ("BlockRemoved", ["a"], "CPU"),
        ("BlockStored", ["c"], "CPU"), ("BlockRemoved", ["b"], "CPU"),
        ("BlockStored", ["d"], "CPU")]
