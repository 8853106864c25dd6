"""Synchronous host loads (``anchorage.tiering.loads``): the decision, and the simulated
replica waiting for a synchronous copy in the step that admits its request, as the engine
does (``tests/node_agent/test_host_tier_engine.py`` runs the engine's side)."""

import math
from types import SimpleNamespace

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.lru import LRUPolicy
from anchorage.pool.block_pool import BlockPool
from anchorage.sim.engine import Replica, SimRequest
from anchorage.tiering.loads import SYNC_LOAD_MAX_S, sync_load
from anchorage.tiering.params import TieringConfig
from tests.sim.test_timed import tiny_profile


def test_the_decision():
    assert SYNC_LOAD_MAX_S == 0.0                   # off by default (the module says why)
    assert sync_load(0.001, 0.0, 0.002)
    assert sync_load(0.001, 0.001, 0.002)          # the step's copies add up to the cap
    assert not sync_load(0.0015, 0.001, 0.002)
    assert not sync_load(0.001, 0.0, 0.0)          # 0: vLLM's, every load between steps
    assert sync_load(5.0, 3.0, math.inf)           # inf: every load (LMCache's connector)
    for bad in (math.nan, -1.0, math.inf):
        assert not sync_load(bad, 0.0, 0.002)
    assert not sync_load(0.001, math.nan, 0.002)
    assert not sync_load(0.001, 0.0, math.nan)


def test_the_simulator_setting_is_checked():
    assert TieringConfig().sync_load_max_s == SYNC_LOAD_MAX_S
    assert TieringConfig(sync_load_max_s=math.inf).sync_load_max_s == math.inf
    for bad in (-0.001, math.nan):
        with pytest.raises(ValueError, match="sync_load_max_s"):
            TieringConfig(sync_load_max_s=bad)


class _Tier:
    """A host tier whose every admission loads 2 blocks over one FIFO link, ``copy_s``
    each."""

    def __init__(self, copy_s: float, max_s: float):
        self.copy_s = copy_s
        self.busy = 0.0
        self.cfg = SimpleNamespace(sync_load_max_s=max_s)

    orders_waiting = False

    def on_arrival(self, req):
        pass

    def on_turn_end(self, req, now):
        pass

    def on_step(self, now):
        pass

    def on_admit(self, req, alloc, now):
        self.busy = max(self.busy, now) + self.copy_s
        return 0, 2, self.busy

    def next_due_s(self):
        return math.inf


def _first_plan(copy_s: float, max_s: float, n: int = 1):
    prof = tiny_profile(capacity=64)
    rep = Replica(0, prof, BlockPool(64, 16, LRUPolicy()))
    rep.tiering = _Tier(copy_s, max_s)
    reqs = []
    for i in range(n):
        ctx = RequestContext(request_id=i, keys=[10 * i + k for k in range(4)],
                             input_length=64, output_length=2)
        reqs.append(SimRequest(ctx, 0.0, index=i))
        rep.enqueue(reqs[-1])
    plan = rep.plan_step(0.0)
    bare = rep.cost(prof, [(tokens, r.num_computed) for r, tokens, _ in plan.items], [])
    return rep, reqs, plan, bare


def test_a_small_load_is_waited_for_in_the_step_that_admits_its_request():
    rep, (r,), plan, bare = _first_plan(0.001, 0.002)
    assert [it[0] for it in plan.items] == [r]      # prefilled in this step ...
    assert r.ready_s == 0.0
    assert plan.duration_s == pytest.approx(bare + 0.001)   # ... which waits for the copy
    assert r.host_hit_blocks == 2 and r.num_computed == 2 * 16


def test_a_load_over_the_cap_runs_between_steps():
    rep, (r,), plan, _ = _first_plan(0.003, 0.002)
    assert plan is not None and not plan.items      # an idle wait for the copy
    assert r.ready_s == pytest.approx(0.003)
    assert plan.duration_s == pytest.approx(0.003)
    rep.finish_step(plan)
    nxt = rep.plan_step(0.003)
    assert [it[0] for it in nxt.items] == [r]       # prefilled a step later


def test_the_steps_synchronous_copies_share_the_cap():
    """Three admissions, 0.8 ms copies one after another on one link: the first two end
    within the 2 ms cap (the step waits 1.6 ms), the third would end at 2.4 ms: it loads
    between steps and runs in a later one."""
    rep, reqs, plan, bare = _first_plan(0.0008, 0.002, n=3)
    assert [it[0] for it in plan.items] == reqs[:2]
    assert plan.duration_s == pytest.approx(bare + 0.0016)
    assert reqs[2].ready_s == pytest.approx(0.0024)
