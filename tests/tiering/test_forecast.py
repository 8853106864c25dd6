import pytest

from anchorage.tiering.forecast import StallForecaster


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
