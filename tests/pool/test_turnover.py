import math

import pytest

from anchorage.pool.turnover import TurnoverEstimator


def test_samples_every_capacity_evictions_from_the_first():
    t = TurnoverEstimator(4)
    assert t.turnover_s == math.inf and not t.started
    t.observe(1, 10.0)          # the clock starts at the first eviction, which counts
    assert t.started and t.turnover_s == math.inf
    t.observe(3, 11.0)
    assert t.turnover_s == math.inf
    assert t.observe(4, 12.0) == pytest.approx(2.0)       # 4 evictions in 2 s
    assert t.observe(8, 22.0) == pytest.approx(0.7 * 2.0 + 0.3 * 10.0)


def test_lazy_cumulative_counts_and_a_fixed_start():
    t = TurnoverEstimator(10, start_s=0.0)
    assert t.observe(25, 5.0) == pytest.approx(0.7 * 5.0 + 0.3 * 0.0)  # two samples at 5 s
    assert t.survival_s(5) == pytest.approx(t.turnover_s * 5 / 10)
    assert TurnoverEstimator(3).survival_s(2) == math.inf


def test_estimate_extrapolates_the_evictions_before_the_first_sample():
    t = TurnoverEstimator(10)
    assert t.estimate_s(0, 5.0) == math.inf          # not started
    t.observe(1, 10.0)
    assert t.estimate_s(1, 10.0) == 0.0              # all at the start
    assert t.estimate_s(4, 12.0) == pytest.approx(2.0 * 10 / 4)
    t.observe(10, 14.0)                              # the first sample: 4 s
    assert t.estimate_s(12, 20.0) == t.turnover_s == pytest.approx(4.0)


def test_rejects_a_bad_weight():
    with pytest.raises(ValueError, match="weight"):
        TurnoverEstimator(4, weight=0.0)
