"""A least-recently-used map bounded in entries *and* in bytes.

Routers keep per-key tables (threads by session id, agents by hint, last replica per
session). Keys carry client-chosen strings, so a bound on entries alone lets a client
that sends long ids grow the table without limit: ``BoundedLRU`` charges each entry
``key_bytes(key)`` (the lengths of its string and bytes parts plus a fixed
``ENTRY_OVERHEAD`` for the tuple, the dict slot and the value) and evicts the least
recently used entries while either ``len > max_entries`` or ``bytes > max_bytes``.
``evicted`` counts evictions; ``on_evict(key, value)``, if given, is told of each. The router caps id lengths at the edge as well; this bound
holds whatever reaches the table.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, Iterator

ENTRY_OVERHEAD = 160          # bytes: tuple + dict slot + small value, CPython 3.11


def key_bytes(key: Any) -> int:
    if isinstance(key, (str, bytes)):
        return ENTRY_OVERHEAD + len(key)
    if isinstance(key, tuple):
        return ENTRY_OVERHEAD + sum(len(x) for x in key if isinstance(x, (str, bytes)))
    return ENTRY_OVERHEAD


class BoundedLRU:
    def __init__(self, max_entries: int, max_bytes: int | None = None,
                 on_evict=None) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes if max_bytes is not None else max_entries * ENTRY_OVERHEAD * 4
        self._d: OrderedDict[Hashable, Any] = OrderedDict()
        self.bytes = 0
        self.evicted = 0
        self.on_evict = on_evict          # called with (key, value) of each evicted entry

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._d

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._d)

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self._d.get(key, default)

    def items(self):
        return self._d.items()

    def values(self):
        return self._d.values()

    def touch(self, key: Hashable) -> None:
        self._d.move_to_end(key)

    def replace(self, key: Hashable, value: Any) -> None:
        """Set the value of an entry already held, keeping its place in the LRU order."""
        if key in self._d:
            self._d[key] = value

    def __getitem__(self, key: Hashable) -> Any:
        return self._d[key]

    def __setitem__(self, key: Hashable, value: Any) -> None:
        d = self._d
        if key in d:
            d[key] = value
            d.move_to_end(key)
            return
        d[key] = value
        self.bytes += key_bytes(key)
        while len(d) > self.max_entries or (self.bytes > self.max_bytes and len(d) > 1):
            self.popitem()

    def pop(self, key: Hashable, default: Any = None) -> Any:
        if key not in self._d:
            return default
        self.bytes -= key_bytes(key)
        return self._d.pop(key)

    def __delitem__(self, key: Hashable) -> None:
        self.pop(key)

    def popitem(self) -> tuple[Hashable, Any]:
        """Remove and return the least recently used entry (counted in ``evicted``)."""
        k, v = self._d.popitem(last=False)
        self.bytes -= key_bytes(k)
        self.evicted += 1
        if self.on_evict is not None:
            self.on_evict(k, v)
        return k, v

    def oldest(self) -> tuple[Hashable, Any] | None:
        for k in self._d:
            return k, self._d[k]
        return None
