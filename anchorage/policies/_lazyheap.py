"""A min-heap of block ids with O(log n) push/pop and O(1) removal (lazy invalidation).

Shared by the heap-ordered baseline policies. Each live block has one token; stale heap
entries (a block that was removed or re-pushed) are skipped when they reach the top. The
heap is compacted when stale entries outnumber live ones, so its size stays O(live).
"""

from __future__ import annotations

import heapq
from typing import Iterator


class LazyHeap:
    __slots__ = ("_heap", "_token", "_counter", "_prio")

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._token: dict[int, int] = {}
        self._counter = 0
        self._prio: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._token)

    def __contains__(self, block: int) -> bool:
        return block in self._token

    def push(self, block: int, priority: tuple) -> None:
        """Insert or re-prioritise ``block``; ties go to the earlier push."""
        self._counter += 1
        c = self._counter
        self._token[block] = c
        self._prio[block] = priority
        heapq.heappush(self._heap, (priority, c, block))
        if len(self._heap) > 64 and len(self._heap) > 2 * len(self._token):
            self._compact()

    def remove(self, block: int) -> bool:
        self._prio.pop(block, None)
        return self._token.pop(block, None) is not None

    def peek(self) -> tuple[tuple, int] | None:
        """(priority, block) of the minimum, without removing it."""
        heap, tok = self._heap, self._token
        while heap:
            pri, c, b = heap[0]
            if tok.get(b) == c:
                return pri, b
            heapq.heappop(heap)
        return None

    def pop(self) -> int | None:
        heap, tok = self._heap, self._token
        while heap:
            _, c, b = heapq.heappop(heap)
            if tok.get(b) == c:
                del tok[b]
                del self._prio[b]
                return b
        return None

    def priority(self, block: int) -> tuple:
        return self._prio[block]

    def ordered(self) -> Iterator[int]:
        """Live blocks, minimum first (O(n log n); tests and reset only)."""
        live = [e for e in self._heap if self._token.get(e[2]) == e[1]]
        return (e[2] for e in sorted(live))

    def clear(self) -> None:
        self._heap.clear()
        self._token.clear()
        self._prio.clear()

    def _compact(self) -> None:
        tok = self._token
        self._heap = [e for e in self._heap if tok.get(e[2]) == e[1]]
        heapq.heapify(self._heap)
