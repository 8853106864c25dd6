"""Agent fingerprints and session inference from prompt prefixes alone.

Every agent invocation starts with the agent's *anchor* (system prompt, tool definitions,
few-shot examples), followed by anything (session history, a new task). Block keys are
chained (a key stands for the whole prefix up to its block), so an anchor is identified by
its **last** block key. The anchor itself is learned: it is the longest leading run of a
prompt's keys that has been seen in at least two sessions.

Specification
-------------
State: ``owner[key]`` = the first session that cached ``key``, or ``SHARED`` once a second
session has used it. The table is LRU-capped at ``max_keys`` entries (a forgotten key is
just seen again as new).

- ``observe(keys, session)``: for each key of the request (O(1) per key): unknown -> owned
  by ``session``; owned by another session -> ``SHARED``.
- ``fingerprint(keys)``: let ``n`` = the length of the leading run of ``SHARED`` keys (the
  anchor). The fingerprint is ``keys[n-1]`` when ``n > 0``; otherwise ``keys[0]`` (an agent
  seen in one session so far is named by its first block) or None for an empty prompt.
  Robust to what follows the anchor; no ``agent`` label is read.
- ``infer_session(keys)``: when a request carries no session id, its session is the one
  whose last prompt it extends: the deepest key of the request's leading run of known
  keys that is some session's *tail* (the last full prompt block of that session's latest
  request, recorded by ``note_tail``). A tail is consumed when extended (a conversation
  continues from its last prompt once; a second request extending it is a branch, i.e.
  a new session). Sharing a common system prompt does not link two requests; continuing
  a conversation does. A request that continues nothing starts a new
  session (the caller names it). Tails are LRU-capped at ``max_keys`` too.
- ``anchor_length(keys)`` = ``n`` above (how many leading blocks are shared);
  ``shared_prefix_len(keys)`` the same by binary search (the router's per-request use).

Costs: O(1) per key; ``state_size_bytes`` counts nothing here (the table is a per-key side
table, like the pool's own hash table).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence

SHARED = object()


class PrefixOwnership:
    """Which session first cached each key; which keys are shared across sessions."""

    __slots__ = ("max_keys", "_owner", "_tails")

    def __init__(self, max_keys: int = 1 << 18):
        if max_keys <= 0:
            raise ValueError("max_keys must be positive")
        self.max_keys = max_keys
        self._owner: OrderedDict[Hashable, object] = OrderedDict()
        self._tails: OrderedDict[Hashable, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def observe(self, keys: Sequence[Hashable], session: object) -> None:
        own = self._owner
        for k in keys:
            cur = own.get(k)
            if cur is None:
                own[k] = session
            else:
                if cur is not SHARED and cur != session:
                    own[k] = SHARED
                own.move_to_end(k)
        while len(own) > self.max_keys:
            own.popitem(last=False)

    def anchor_length(self, keys: Sequence[Hashable]) -> int:
        own = self._owner
        n = 0
        for k in keys:
            if own.get(k) is not SHARED:
                break
            n += 1
        return n

    def shared_prefix_len(self, keys: Sequence[Hashable]) -> int:
        """``anchor_length`` by binary search (O(log n) lookups): the shared keys of a
        prompt are prefix-closed (a key stands for its whole prefix, so two sessions that
        used a key used its prefix too), up to the table's LRU forgetting a prefix key
        before its descendant, where the two may differ by the forgotten part."""
        own = self._owner
        if not keys or own.get(keys[0]) is not SHARED:
            return 0
        lo, hi = 1, len(keys)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if own.get(keys[mid - 1]) is SHARED:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def fingerprint(self, keys: Sequence[Hashable]) -> Hashable | None:
        if not keys:
            return None
        n = self.anchor_length(keys)
        return keys[n - 1] if n else keys[0]

    def note_tail(self, key: Hashable, session: object) -> None:
        tails = self._tails
        tails[key] = session
        tails.move_to_end(key)
        while len(tails) > self.max_keys:
            tails.popitem(last=False)

    def infer_session(self, keys: Sequence[Hashable]) -> object | None:
        """The session whose latest prompt this request extends, else None."""
        own, tails = self._owner, self._tails
        found = found_key = None
        for k in keys:
            if k not in own:
                break
            t = tails.get(k)
            if t is not None:
                found, found_key = t, k
        if found_key is not None:
            del tails[found_key]
        return found
