import pytest

from anchorage.tiering.forecast import IdleEstimate, StallForecaster


def test_default_then_ewma_then_histogram():
    f = StallForecaster(min_samples=8, default_s=1.5)
    assert f.predict("grep") == 1.5
    f.observe(4.0, "grep")
    assert f.predict("grep") == 4.0                       # after the first execution
    f.observe(2.0, "grep")
    assert f.predict("grep") == pytest.approx(0.8 * 4.0 + 0.2 * 2.0)
    for _ in range(10):
        f.observe(10.0, "run_tests", {"path": "tests/"})
    # enough samples: the histogram's E[tau - e | tau > e]
    assert f.predict("run_tests", {"path": "tests/"}) == pytest.approx(10.0)
    assert f.predict("run_tests", {"path": "tests/"}, elapsed_s=4.0) == pytest.approx(6.0)


def test_user_estimate_is_blended_with_history():
    f = StallForecaster(estimates={"web": 3.0})
    assert f.predict("web") == 3.0
    f.observe(1.0, "web")
    assert f.predict("web") == pytest.approx(2.0)


def test_idle_estimate_is_the_one_source_for_simulator_and_engine():
    from anchorage.node_agent.temporal import TemporalParams

    from anchorage.tiering.sim import TieringConfig
    est = IdleEstimate()
    assert (est.default_stall_s, est.queue_wait, est.wait_ewma) == (1.0, True, 0.2)
    assert est.idle_s(2.0, 10.0) == 12.0
    assert IdleEstimate(queue_wait=False).idle_s(2.0, 10.0) == 2.0
    assert est.next_wait(10.0, 20.0) == pytest.approx(12.0)
    assert est.next_wait(10.0, -5.0) == pytest.approx(8.0)  # a negative wait counts as 0
    assert IdleEstimate(default_stall_s=3.0).forecaster().predict("t") == 3.0
    for cls, kw in ((TieringConfig, {}), (TemporalParams, {})):
        c = cls(**kw, wait_ewma=0.5, queue_wait=False)
        assert isinstance(c, IdleEstimate) and c.idle_s(1.0, 5.0) == 1.0
        assert c.next_wait(0.0, 4.0) == 2.0
        with pytest.raises(ValueError, match="wait_ewma"):
            cls(**kw, wait_ewma=1.5)
