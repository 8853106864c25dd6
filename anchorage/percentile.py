"""Percentiles: the one definition every report uses (the simulator's, the drive's and
``anchorage trace stats``).

``percentile(values, q)`` is the q-th percentile, ``q`` in [0, 100], by linear
interpolation between the closest ranks (Hyndman & Fan's type 7, numpy's default
``method="linear"``): with ``xs`` the sorted values and ``pos = (n - 1) q / 100``,

    xs[floor(pos)] + (xs[floor(pos) + 1] - xs[floor(pos)]) * (pos - floor(pos))

NaN for no values. ``percentiles(values, qs)`` gives several from one sort. The formula is
evaluated as written above, in numpy, rather than by ``np.percentile``: that one computes
the upper half of each interval from the other end (``b - (b - a)(1 - t)``), which differs
in the last bit for about one value in twelve, and the simulator's committed figures
(``bench/results``) were computed as above.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    if len(values) == 0:
        return [math.nan] * len(qs)
    xs = np.sort(np.asarray(values, dtype=np.float64))
    q = np.asarray(qs, dtype=np.float64)
    if ((q < 0) | (q > 100)).any():
        raise ValueError(f"percentiles must be in [0, 100], got {list(qs)}")
    pos = (len(xs) - 1) * q / 100.0
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, len(xs) - 1)
    return [float(v) for v in xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)]


def percentile(values: Sequence[float], q: float) -> float:
    return percentiles(values, (q,))[0]
