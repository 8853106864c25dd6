"""Multi-step reach (``TransitionLearner.hit``) and the turnover-sized step horizon."""

from __future__ import annotations

import math

import pytest

from anchorage.policies.group_eviction import GroupEvictionPolicy
from anchorage.policies.transitions import END, TransitionLearner


def _cycle(n_rounds: int = 50) -> TransitionLearner:
    tl = TransitionLearner(eps=0.01)
    for _ in range(n_rounds):
        tl.observe("a", "b")
        tl.observe("b", "c")
        tl.observe("c", "a")
    tl.observe("c", END)
    return tl


def test_hit_on_a_cycle_sees_certain_but_later_reuse():
    tl = _cycle()
    p2, _ = tl.hit("a", "a", 2)  # a -> b -> c -> a needs three steps
    p4, s4 = tl.hit("a", "a", 4)
    assert p2 < 0.01
    assert p4 > 0.95 and 2.9 < s4 < 3.1
    p, s = tl.hit("a", "c", 8)
    assert p > 0.95 and 1.9 < s < 2.1
    assert tl.hit_fast("a", "c", 8) == (p, s)


def test_hit_with_two_steps_matches_reach_when_every_agent_is_seen():
    tl = _cycle()
    for i in "abc":  # every row has every agent (reach skips unseen middle agents)
        for j in "abc":
            tl.observe(i, j)
    for i in "abc":
        for j in "abc":
            ph, sh = tl.hit(i, j, 2)
            pr, sr = tl.reach(i, j)
            assert ph == pytest.approx(pr, abs=1e-9) and sh == pytest.approx(sr, abs=1e-9)


def test_end_is_absorbing():
    tl = TransitionLearner(eps=0.01)
    for _ in range(20):
        tl.observe("a", END)
        tl.observe("a", "b")
    p, _ = tl.hit("a", "b", 32)
    assert p == pytest.approx(0.5, abs=0.02)  # half the sessions end at a


def test_reach_horizon_follows_cache_turnover():
    default = GroupEvictionPolicy(block_size=16)
    default.step_gap, default._turnover_s = 1.0, 13.0
    assert default._reach_k() == 2  # the default is the two-step reach
    pol = GroupEvictionPolicy(block_size=16, reach_steps="turnover")
    assert pol._reach_k() == 2  # nothing measured
    pol.step_gap, pol._turnover_s = 1.0, 3.0
    assert pol._reach_k() == 2  # under 4 steps per turnover: the two-step reach
    pol._turnover_s = 13.0
    assert pol._reach_k() == 8  # rounded down to a power of two
    pol._turnover_s = math.inf
    assert pol._reach_k() == 2
    assert GroupEvictionPolicy(block_size=16, reach_steps=6)._reach_k() == 6
    with pytest.raises(ValueError, match="reach_steps"):
        GroupEvictionPolicy(block_size=16, reach_steps=1)
