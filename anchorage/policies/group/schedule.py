"""When group-scored eviction re-scores: full re-scorings and re-keyings (no learning, no
scores: the policy does the re-scoring, ``groups.GroupHeap.rescore``).

Specification
-------------
Re-scoring (CacheWise section 5.3) puts every group with free blocks in the frame of the
policy clock's reading ``now``: their keys are re-taken and ``epoch = now`` (``groups``
spec). G is the number of groups with free blocks.

- *Full* re-scoring (the model's ``refresh`` first: ``model`` spec), ``at_request``: when
  a request arrives, the clock advanced by the model's ``rescore_interval`` (a quarter of
  the cache turnover time, or the median session gap if shorter) since the last full
  re-scoring, and at least G victims were taken since; ``at_victim``: after 4 G victims
  (at least 1,024) since.
- *Re-keying* (keys only; the full schedule is unchanged): at the next victim after an
  event that makes keys stale at once (``due``): the pool's first victim, also the first
  after the policy's ``reset`` (keys set so far are in the frame of the clock's first
  reading, where a group scored ``T > 0`` goes before every recency group freed since),
  and a change of regime of ``first_return`` (``first_return``: entering or leaving 1,
  every one-request session's key changes; ``view`` spec); ``at_request``, before the
  first turnover sample: the clock advanced by the model's ``rekey_interval`` since the
  last re-keying of either kind and at least G victims were taken since.

Amortised O(log G) per victim, plus O(G) per change of regime (the reuse counts must cross
1/2 again for the next). State: five numbers and a flag.
"""

from __future__ import annotations

NONE, REKEY, FULL = 0, 1, 2


class Schedule:
    """The re-scoring schedule's counters (module spec); the policy calls ``done`` after
    each re-scoring it makes."""

    __slots__ = ("since_full", "full_s", "since_rekey", "rekey_s", "due", "first_low")

    def __init__(self) -> None:
        self.since_full = 0     # victims since the last full re-scoring
        self.full_s = 0.0       # clock at the last full re-scoring (first reading before)
        self.since_rekey = 0    # victims since the last re-scoring of either kind
        self.rekey_s = 0.0      # clock at the last re-scoring of either kind
        self.due = True         # re-key at the next victim: the first victim is one
        self.first_low = False  # first_return() < 1 at the last reading

    def start(self, now: float) -> None:
        """The clock's first reading: the frame of every key set before a re-scoring."""
        self.full_s = self.rekey_s = now

    def at_request(self, now: float, groups: int, rescore_interval: float,
                   rekey_interval: float) -> int:
        """At a request: ``FULL``, ``REKEY`` or ``NONE``."""
        if now - self.full_s > rescore_interval and self.since_full >= groups:
            return FULL
        if now - self.rekey_s > rekey_interval and self.since_rekey >= groups:
            return REKEY
        return NONE

    def at_victim(self, groups: int) -> bool:
        """One more victim (counted); True: re-score in full now."""
        self.since_rekey += 1
        n = self.since_full = self.since_full + 1
        return n > 1024 and n > 4 * groups

    def first_return(self, low: bool) -> None:
        """``first_return() < 1`` now (``low``): a change of regime makes a re-keying due."""
        if low != self.first_low:
            self.first_low = low
            self.due = True

    def done(self, full: bool, now: float) -> None:
        if full:
            self.since_full = 0
            self.full_s = now
        self.since_rekey = 0
        self.rekey_s = now
        self.due = False
