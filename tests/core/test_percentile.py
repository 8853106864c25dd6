"""``anchorage.percentile``: the one percentile of the simulator, the drive report and
``anchorage trace stats``."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from anchorage.percentile import percentile, percentiles


def reference(values, q):
    """The simulator's definition before it moved here, term by term."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_linear_between_closest_ranks():
    assert percentile([0.3, 0.1], 50) == pytest.approx(0.2)
    assert percentile([0.1, 0.3], 90) == pytest.approx(0.28)
    assert percentiles([5, 1, 3, 2, 4], [0, 25, 50, 100]) == [1.0, 2.0, 3.0, 5.0]
    assert percentile([7], 99) == 7.0
    assert math.isnan(percentile([], 50)) and all(math.isnan(v) for v in percentiles([], [1, 2]))
    with pytest.raises(ValueError, match=r"in \[0, 100\]"):
        percentile([1.0], 0.9 * 1000)


def test_bit_identical_to_the_simulators_formula_and_close_to_numpy():
    rng = random.Random(5)
    for trial in range(300):
        n = rng.randint(1, 500)
        xs = ([rng.lognormvariate(-1, 1) for _ in range(n)] if trial % 2
              else [rng.randrange(100) for _ in range(n)])
        qs = (0, 50, 90, 99, 99.9, 100)
        got = percentiles(xs, qs)
        assert [repr(v) for v in got] == [repr(float(reference(xs, q))) for q in qs]
        assert got == pytest.approx(np.percentile(xs, qs), rel=1e-12, abs=1e-12)
