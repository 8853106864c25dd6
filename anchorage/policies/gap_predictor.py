"""Session gap prediction: expected time until a session's next request, given the time
already elapsed (CacheWise section 5.2, made online).

Specification
-------------
A *gap* tau is the time from a session's request completing to its next request (tool time
plus think time). Gaps are learned only when the next request actually arrives; a session
that never returns is an *end* (tau = inf), counted when the policy decides the session has
ended (``record_end``).

``GapHistogram``: a log-binned empirical distribution. Bin ``b`` covers
``[lo * 2**b, lo * 2**(b+1))`` seconds (``lo = 1 ms``, 26 bins, up to ~9 h; gaps outside
are clamped to the first/last bin), keeping a count and the sum of the gaps that fell in
it, plus ``ends``, the count of sessions that never came back. Given elapsed time ``e``:

- finite mass beyond ``e``: ``C(e) = sum_{b: hi_b > e} w_b * n_b`` where ``w_b`` is 1 for a
  bin entirely above ``e`` and ``(hi_b - e) / (hi_b - lo_b)`` for the bin holding ``e``;
- probability of return: ``P(e) = C(e) / (C(e) + ends)``;
- conditional remaining time (eq. of section 5.2, ``E[tau - e | tau > e]``):
  ``r(e) = sum_b w_b * m_b / C(e) - e`` with ``m_b`` the bin's sum (the partial bin uses
  its mean clipped to at least ``(e + hi_b) / 2``); at least one bin width above ``e`` when
  ``C(e) = 0``;
- ``p_within(e, h) = (C(e) - C(e + h)) / (C(e) + ends)``: return within ``h`` seconds;
- ``expected_wait(e) = r(e) / max(P(e), p_floor)``: time per expected reuse, the quantity an
  online Belady evicts the largest of (holding a block costs time; it pays off with
  probability ``P``). ``p_floor = 0.02``.

``GapPredictor``: histograms keyed by context (global; per tool name, where "no pending
tool" is a context of its own once any tool has been seen; per (tool, argument cluster)),
LRU-capped at ``max_keys`` (default 64). ``predict(e, tool, cluster)`` uses the
most specific histogram with at least ``min_samples`` (default 16) observations, else None
(no signal: the caller falls back to recency). All operations are O(bins) = O(1).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Hashable

LO_S = 0.001
NBINS = 26
P_FLOOR = 0.02


def bin_of(gap_s: float) -> int:
    if gap_s < LO_S * 2:
        return 0
    # exponent of gap / LO_S in base 2, clamped
    b = int(gap_s / LO_S).bit_length() - 1
    return b if b < NBINS else NBINS - 1


class GapHistogram:
    __slots__ = ("counts", "sums", "ends", "n", "_memo", "_memo_n", "_memo_ends", "_bins")

    def __init__(self) -> None:
        self.counts = array("d", bytes(8 * NBINS))
        self.sums = array("d", bytes(8 * NBINS))
        self.ends = 0.0
        self.n = 0
        self._memo: dict[int, float] = {}
        self._memo_n = 0
        self._memo_ends = 0.0
        self._bins = 0  # number of non-empty bins

    def expected_wait_fast(self, elapsed_s: float) -> float:
        """``expected_wait`` at ``elapsed_s`` rounded to 1/8 of its log2 bin, memoised
        until the histogram changes by more than ~3 % (the hot path's version)."""
        n, ends = self.n, self.ends
        if (n - self._memo_n > 1 + (self._memo_n >> 5)
                or abs(ends - self._memo_ends) > 1 + self._memo_ends / 32):
            self._memo.clear()
            self._memo_n, self._memo_ends = n, ends
        e = elapsed_s if elapsed_s > 0 else 0.0
        b = bin_of(e)
        lo = LO_S * (1 << b) if b else 0.0
        width = LO_S * (1 << b) if b else LO_S * 2
        sub = int((e - lo) / width * 8) if e > lo else 0
        key = b * 8 + (sub if sub < 8 else 7)
        w = self._memo.get(key)
        if w is None:
            w = self._memo[key] = self.expected_wait(lo + width * ((key & 7) + 0.5) / 8)
        return w

    def add(self, gap_s: float) -> None:
        b = bin_of(max(0.0, gap_s))
        if not self.counts[b]:
            self._bins += 1
        self.counts[b] += 1.0
        self.sums[b] += gap_s
        self.n += 1

    def add_end(self, weight: float = 1.0) -> None:
        self.ends += weight

    def remove_end(self, weight: float = 1.0) -> None:
        self.ends = max(0.0, self.ends - weight)

    def tail(self, elapsed_s: float) -> tuple[float, float]:
        """(C(e), sum of gaps beyond e): the finite mass beyond ``elapsed_s``."""
        e = max(0.0, elapsed_s)
        b0 = bin_of(e)
        counts, sums = self.counts, self.sums
        c = m = 0.0
        for b in range(b0 + 1, NBINS):
            c += counts[b]
            m += sums[b]
        n0 = counts[b0]
        if n0:
            lo = 0.0 if b0 == 0 else LO_S * (1 << b0)
            hi = LO_S * (1 << (b0 + 1))
            if b0 == NBINS - 1:
                hi = max(hi, sums[b0] / n0 * 2)
            w = (hi - e) / (hi - lo) if hi > e else 0.0
            if w > 0:
                mean = max(sums[b0] / n0, (e + hi) / 2)
                c += w * n0
                m += w * n0 * mean
        return c, m

    def p_return(self, elapsed_s: float) -> float:
        c, _ = self.tail(elapsed_s)
        tot = c + self.ends
        return c / tot if tot > 0 else 0.0

    def p_within(self, elapsed_s: float, horizon_s: float) -> float:
        """P(e < tau <= e + h | tau > e): the session returns within ``horizon_s``."""
        c0, _ = self.tail(elapsed_s)
        tot = c0 + self.ends
        if tot <= 0:
            return 0.0
        if horizon_s == float("inf"):
            return c0 / tot
        c1, _ = self.tail(max(0.0, elapsed_s) + horizon_s)
        return max(0.0, c0 - c1) / tot

    def remaining(self, elapsed_s: float) -> float:
        """E[tau - e | tau > e] over the finite gaps."""
        c, m = self.tail(elapsed_s)
        e = max(0.0, elapsed_s)
        if c <= 0:
            return max(e, LO_S * (1 << (bin_of(e) + 1)) - e)
        return max(m / c - e, 0.0)

    def expected_wait(self, elapsed_s: float) -> float:
        c, m = self.tail(elapsed_s)
        e = max(0.0, elapsed_s)
        if c <= 0:
            r = max(e, LO_S * (1 << (bin_of(e) + 1)) - e)
            return r / P_FLOOR
        r = max(m / c - e, 0.0)
        p = c / (c + self.ends)
        return r / (p if p > P_FLOOR else P_FLOOR)

    def quantile(self, q: float) -> float:
        """Upper edge of the bin where the finite CDF reaches ``q`` (0 if empty)."""
        tot = sum(self.counts)
        if tot <= 0:
            return 0.0
        acc = 0.0
        for b in range(NBINS):
            acc += self.counts[b]
            if acc >= q * tot:
                return LO_S * (1 << (b + 1))
        return LO_S * (1 << NBINS)

    def informative(self) -> bool:
        """False when every gap fell in one bin (e.g. no timing at all): such a histogram
        says nothing a recency order does not."""
        return self._bins >= 2

    def size_bytes(self) -> int:
        return 2 * 8 * NBINS + 16


class GapPredictor:
    """Gap histograms by context: global, per tool, per (tool, cluster); LRU-capped."""

    def __init__(self, min_samples: int = 16, max_keys: int = 64,
                 no_tool_context: bool = False):
        self.no_tool_context = no_tool_context
        self.min_samples = min_samples
        self.max_keys = max_keys
        self.global_hist = GapHistogram()
        self.tools_seen = False
        self.tool_gaps = 0  # gaps that followed a tool call
        self._hists: OrderedDict[Hashable, GapHistogram] = OrderedDict()

    def _hist(self, key: Hashable, create: bool) -> GapHistogram | None:
        h = self._hists.get(key)
        if h is None:
            if not create:
                return None
            h = self._hists[key] = GapHistogram()
            if len(self._hists) > self.max_keys:
                self._hists.popitem(last=False)
        else:
            self._hists.move_to_end(key)
        return h

    def _contexts(self, tool: Hashable | None, cluster: Hashable | None):
        if tool is None:
            # "no pending tool" (user think time) is a context of its own once tools exist
            return (("t", None),) if (self.tools_seen and self.no_tool_context) else ()
        if cluster is None:
            return (("t", tool),)
        return (("t", tool), ("c", tool, cluster))

    def observe(self, gap_s: float, tool: Hashable | None = None,
                cluster: Hashable | None = None) -> None:
        self.global_hist.add(gap_s)
        if tool is not None:
            self.tools_seen = True
            self.tool_gaps += 1
        for key in self._contexts(tool, cluster):
            self._hist(key, True).add(gap_s)

    def observe_end(self, tool: Hashable | None = None, cluster: Hashable | None = None,
                    weight: float = 1.0) -> None:
        self.global_hist.add_end(weight)
        for key in self._contexts(tool, cluster):
            self._hist(key, True).add_end(weight)

    def retract_end(self, tool: Hashable | None = None, cluster: Hashable | None = None,
                    weight: float = 1.0) -> None:
        """A session counted as ended came back: undo its end."""
        self.global_hist.remove_end(weight)
        for key in self._contexts(tool, cluster):
            h = self._hists.get(key)
            if h is not None:
                h.remove_end(weight)

    def histogram(self, tool: Hashable | None = None,
                  cluster: Hashable | None = None) -> GapHistogram | None:
        """The most specific histogram with enough samples, or None."""
        ms = self.min_samples
        for key in reversed(self._contexts(tool, cluster)):
            h = self._hists.get(key)
            if h is not None and h.n >= ms:
                return h
        g = self.global_hist
        return g if g.n >= ms else None

    @property
    def tool_fraction(self) -> float:
        """Share of learned gaps that followed a tool call."""
        n = self.global_hist.n
        return self.tool_gaps / n if n else 0.0

    def specific(self, tool: Hashable | None = None,
                 cluster: Hashable | None = None) -> GapHistogram | None:
        """The most specific per-tool/per-cluster histogram with enough samples (never the
        global one), or None."""
        ms = self.min_samples
        for key in reversed(self._contexts(tool, cluster)):
            h = self._hists.get(key)
            if h is not None and h.n >= ms:
                return h
        return None

    def predict(self, elapsed_s: float, tool: Hashable | None = None,
                cluster: Hashable | None = None) -> float | None:
        h = self.histogram(tool, cluster)
        return None if h is None else h.expected_wait(elapsed_s)

    def size_bytes(self) -> int:
        return self.global_hist.size_bytes() * (1 + len(self._hists))
