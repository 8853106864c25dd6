"""Agent transitions learned per session (CacheScout section 3.2, eqs. 2-5, made correct
for concurrent sessions).

Specification
-------------
Agents are fingerprints (``anchorage.fingerprint``). A transition ``i -> j`` is observed
when **the same session** calls agent ``j`` right after agent ``i``; the global interleaved
order of requests is never used (with hundreds of concurrent sessions it is noise). The
pseudo-agent ``END`` is the target when a session ends.

- counts ``C[i][j]``, row totals ``n_i``; the agent table is LRU-capped at ``max_agents``
  (default 64): forgetting an agent drops its row and its column entries.
- eq. 3, smoothed probability over the ``A`` known targets (agents and END):
  ``P(j | i) = (C_ij + eps) / (n_i + eps * A)``, ``eps = 0.1``. An unseen row is uniform.
- eq. 5, next agent: ``argmax_j P(j | i)`` (END excluded), ties to the most recent agent.
- eq. 2, predictability: ``R = 1 - H(A_{t+1} | A_t) / H(A_{t+1})`` with
  ``H(A_{t+1} | A_t) = sum_i (n_i / N) H(P(. | i))`` and ``H(A_{t+1})`` the entropy of the
  marginal ``sum_i (n_i / N) P(. | i)``, both over the smoothed rows. R = 0 when nothing is
  learned or the marginal has zero entropy.
- ``reach(i, j)``: probability that a session now at ``i`` calls ``j`` within two steps,
  ``p1 + sum_{k != j, END} P(k | i) P(j | k)``, and the expected number of steps given
  the two-step horizon, ``(p1 + 2 p2) / (p1 + p2)``. Used by the survival scorer as an
  expected step count instead of a truncated hop distance.
- ``hit(i, j, k)``: the same over ``k`` steps: the probability ``h_k(i)`` that a session now
  at ``i`` calls ``j`` within ``k`` steps before it ends, over the smoothed chain with
  ``END`` absorbing, ``h_t(i) = P(j | i) + sum_{m != j, END} P(m | i) h_{t-1}(m)``
  (``h_0 = 0``), and the expected steps given that, ``s_k(i) = M_k(i) / h_k(i)`` with
  ``M_t(i) = h_t(i) + sum_{m != j, END} P(m | i) M_{t-1}(m)``. Value iteration for one
  target gives every ``i`` at once: O(k (nnz + A)), stopped early once ``h`` moves by
  less than 1e-4; ``hit_fast`` memoises per (target, k) like ``reach_fast``. ``k = 2``
  equals ``reach`` except that ``reach`` skips the smoothing mass of unseen middle agents.

Costs: ``observe`` O(1); ``prob`` O(1); ``next_agent`` O(row); ``reach`` O(row);
``predictability`` O(nonzero counts) (the prefetch advisor calls it, not the hot path).
State: 16 bytes per non-zero count plus 48 per agent (``state_size_bytes``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Hashable, Iterable

END = "<end>"


class TransitionLearner:
    def __init__(self, eps: float = 0.1, max_agents: int = 64):
        if eps <= 0:
            raise ValueError("eps must be positive")
        self.eps = eps
        self.max_agents = max_agents
        self._rows: OrderedDict[Hashable, dict[Hashable, float]] = OrderedDict()
        self._tot: dict[Hashable, float] = {}
        self.total = 0.0
        self._reach_memo: dict[tuple, tuple[float, float]] = {}
        self._memo_total = 0.0
        self._r_memo: tuple[float, float] | None = None
        self._hit_memo: dict[tuple, dict[Hashable, tuple[float, float]]] = {}
        self._hit_total = 0.0

    # -- learning -------------------------------------------------------------------------

    def touch_agent(self, a: Hashable) -> None:
        rows = self._rows
        if a in rows:
            rows.move_to_end(a)
            return
        rows[a] = {}
        self._tot[a] = 0.0
        while len(rows) > self.max_agents:
            old, row = rows.popitem(last=False)
            self.total -= self._tot.pop(old)
            for r_a, r in rows.items():
                c = r.pop(old, None)
                if c:
                    self._tot[r_a] -= c
                    self.total -= c

    def observe(self, i: Hashable, j: Hashable, weight: float = 1.0) -> None:
        self.touch_agent(i)
        if j != END and not isinstance(j, bool):  # bool targets: a yes/no learner
            self.touch_agent(j)
        row = self._rows.get(i)
        if row is None:  # i was the evicted one (max_agents == 1)
            return
        row[j] = row.get(j, 0.0) + weight
        self._tot[i] += weight
        self.total += weight

    # -- queries --------------------------------------------------------------------------

    @property
    def agents(self) -> list[Hashable]:
        return list(self._rows)

    def n_targets(self) -> int:
        return len(self._rows) + 1  # agents and END

    def row_total(self, i: Hashable) -> float:
        return self._tot.get(i, 0.0)

    def row_counts(self, i: Hashable) -> dict[Hashable, float]:
        """The raw counts ``C[i][j]`` of row ``i`` (read only; empty if unknown)."""
        return self._rows.get(i) or {}

    def count(self, i: Hashable, j: Hashable) -> float:
        row = self._rows.get(i)
        return row.get(j, 0.0) if row else 0.0

    def prob(self, i: Hashable, j: Hashable) -> float:
        a = self.n_targets()
        row = self._rows.get(i)
        if not row:
            return 1.0 / a
        return (row.get(j, 0.0) + self.eps) / (self._tot[i] + self.eps * a)

    def row(self, i: Hashable) -> dict[Hashable, float]:
        """Smoothed next-agent distribution from ``i`` over all known targets."""
        targets: Iterable[Hashable] = list(self._rows) + [END]
        return {j: self.prob(i, j) for j in targets}

    def next_agent(self, i: Hashable) -> tuple[Hashable | None, float]:
        row = self._rows.get(i)
        if not row:
            return None, 0.0
        best, best_c = None, -1.0
        for j, c in row.items():
            if j != END and c >= best_c:
                best, best_c = j, c
        if best is None:
            return None, 0.0
        return best, self.prob(i, best)

    def reach_fast(self, i: Hashable, j: Hashable) -> tuple[float, float]:
        """``reach`` memoised until the counts grow by more than ~3 % (hot path)."""
        if self.total - self._memo_total > 1 + self._memo_total / 32 or self.total < self._memo_total:
            self._reach_memo.clear()
            self._memo_total = self.total
        key = (i, j)
        r = self._reach_memo.get(key)
        if r is None:
            r = self._reach_memo[key] = self.reach(i, j)
            if len(self._reach_memo) > 4 * self.max_agents * self.max_agents:
                self._reach_memo.clear()
        return r

    def reach(self, i: Hashable, j: Hashable) -> tuple[float, float]:
        """(P(j within 2 steps from i), expected steps given that)."""
        row = self._rows.get(i)
        if not row:
            return 0.0, 2.0
        p1 = self.prob(i, j)
        tot_i = self._tot[i]
        a = self.n_targets()
        eps = self.eps
        p2 = 0.0
        rows = self._rows
        for k, c in row.items():  # sparse: unseen k carry only smoothing mass
            if k == j or k == END:
                continue
            pk = (c + eps) / (tot_i + eps * a)
            rk = rows.get(k)
            if rk:
                p2 += pk * (rk.get(j, 0.0) + eps) / (self._tot[k] + eps * a)
        p = p1 + p2
        if p > 1.0:
            p = 1.0
        steps = (p1 + 2 * p2) / (p1 + p2) if p1 + p2 > 0 else 2.0
        return p, steps

    def hit_fast(self, i: Hashable, j: Hashable, k: int) -> tuple[float, float]:
        """``hit`` memoised per (target, k) until the counts grow by more than ~3 %."""
        if (self.total - self._hit_total > 1 + self._hit_total / 32
                or self.total < self._hit_total):
            self._hit_memo.clear()
            self._hit_total = self.total
        key = (j, k)
        v = self._hit_memo.get(key)
        if v is None:
            v = self._hit_memo[key] = self.hit_all(j, k)
            if len(self._hit_memo) > 4 * self.max_agents:
                self._hit_memo.clear()
                self._hit_memo[key] = v
        return v.get(i, (0.0, 2.0))

    def hit(self, i: Hashable, j: Hashable, k: int) -> tuple[float, float]:
        """(P(j within ``k`` steps from i, before END), expected steps given that)."""
        return self.hit_all(j, k).get(i, (0.0, 2.0))

    def hit_all(self, j: Hashable, k: int,
                tol: float = 1e-4) -> dict[Hashable, tuple[float, float]]:
        """``hit(i, j, k)`` for every known agent ``i`` (value iteration, module spec)."""
        rows, tots = self._rows, self._tot
        a = self.n_targets()
        eps = self.eps
        h = dict.fromkeys(rows, 0.0)
        m = dict.fromkeys(rows, 0.0)
        for _ in range(max(1, k)):
            sh = sum(v for x, v in h.items() if x != j)
            sm = sum(v for x, v in m.items() if x != j)
            nh: dict[Hashable, float] = {}
            nm: dict[Hashable, float] = {}
            delta = 0.0
            for i, row in rows.items():
                if not row:  # unseen row: uniform
                    pj, qh, qm = 1.0 / a, sh / a, sm / a
                else:
                    d = tots[i] + eps * a
                    pj = (row.get(j, 0.0) + eps) / d
                    ch = cm = 0.0
                    for x, c in row.items():
                        if x == j or x == END:
                            continue
                        hx = h.get(x)
                        if hx is not None:
                            ch += c * hx
                            cm += c * m[x]
                    qh, qm = (ch + eps * sh) / d, (cm + eps * sm) / d
                v = pj + qh
                nh[i] = v if v < 1.0 else 1.0
                nm[i] = v + qm
                dv = v - h[i]
                if dv > delta:
                    delta = dv
            h, m = nh, nm
            if delta < tol:
                break
        return {i: (h[i], m[i] / h[i] if h[i] > 0 else 2.0) for i in rows}

    def predictability(self) -> float:
        """R (eq. 2) over the smoothed rows, weighted by how often each row was left."""
        if self.total <= 0:
            return 0.0
        targets = list(self._rows) + [END]
        marg = dict.fromkeys(targets, 0.0)
        h_cond = 0.0
        for i in self._rows:
            w = self._tot[i] / self.total
            if w <= 0:
                continue
            h = 0.0
            for j in targets:
                p = self.prob(i, j)
                marg[j] += w * p
                h -= p * math.log(p)
            h_cond += w * h
        h_marg = -sum(p * math.log(p) for p in marg.values() if p > 0)
        if h_marg <= 1e-12:
            return 0.0
        return max(0.0, 1.0 - h_cond / h_marg)

    def predictability_fast(self) -> float:
        """``predictability`` memoised until the counts grow by more than ~3 %."""
        memo = self._r_memo
        if memo is None or self.total - memo[0] > 1 + memo[0] / 32 or self.total < memo[0]:
            memo = self._r_memo = (self.total, self.predictability())
        return memo[1]

    def state_size_bytes(self) -> int:
        nz = sum(len(r) for r in self._rows.values())
        return 16 * nz + 48 * len(self._rows)
