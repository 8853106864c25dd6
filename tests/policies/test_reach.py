"""Multi-step reach (``TransitionLearner.hit``) and the turnover-sized step horizon."""

from __future__ import annotations

import math

import pytest

from anchorage.policies.registry import make_policy
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


def _reach_k(pol, step_gap: float, turnover_s: float) -> int:
    pol.model.step_gap, pol.model.turnover.turnover_s = step_gap, turnover_s
    return pol.view.reach_k()


def test_reach_horizon_follows_cache_turnover():
    default = make_policy("hybrid", block_size=16)
    assert _reach_k(default, 1.0, 13.0) == 2  # the default is the two-step reach
    pol = make_policy("hybrid", block_size=16, reach_steps="turnover")
    assert pol.view.reach_k() == 2  # nothing measured
    assert _reach_k(pol, 1.0, 3.0) == 2  # under 4 steps per turnover: the two-step reach
    assert _reach_k(pol, 1.0, 13.0) == 8  # rounded down to a power of two
    assert _reach_k(pol, 1.0, math.inf) == 2
    assert make_policy("hybrid", block_size=16, reach_steps=6).view.reach_k() == 6
    with pytest.raises(ValueError, match="reach_steps"):
        make_policy("hybrid", block_size=16, reach_steps=1)
