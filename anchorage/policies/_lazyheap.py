"""Priority structures of block ids shared by the heap-ordered baseline policies.

``LazyHeap``: a min-heap with O(log n) push/pop and O(1) removal (lazy invalidation: each
live block has one token; stale entries are skipped when they reach the top, and the heap
is compacted when they outnumber live ones, so its size stays O(live)).

``BucketQueue``: blocks grouped by equal priority (one FIFO bucket per distinct priority,
a heap over the distinct priorities). Push, removal and pop are O(1) per block plus
O(log b) per new bucket, where b is the number of distinct live priorities; ties pop in
push order. The right structure when many blocks share a priority (one release, one
frequency count).
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator


class LazyHeap:
    __slots__ = ("_heap", "_token", "_counter")

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._token: dict[int, int] = {}
        self._counter = 0

    def __len__(self) -> int:
        return len(self._token)

    def __contains__(self, block: int) -> bool:
        return block in self._token

    def __iter__(self) -> Iterator[int]:
        """Live blocks, in no particular order."""
        return iter(self._token)

    def push(self, block: int, priority: Any) -> None:
        """Insert or re-prioritise ``block``; ties go to the earlier push."""
        c = self._counter = self._counter + 1
        self._token[block] = c
        heap = self._heap
        heapq.heappush(heap, (priority, c, block))
        if not c & 255 and len(heap) > 64 and len(heap) > 2 * len(self._token):
            self._compact()

    def remove(self, block: int) -> bool:
        return self._token.pop(block, None) is not None

    def peek(self) -> tuple[Any, int] | None:
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
                return b
        return None

    def ordered(self) -> Iterator[int]:
        """Live blocks, minimum first (O(n log n); tests and reset only)."""
        live = [e for e in self._heap if self._token.get(e[2]) == e[1]]
        return (e[2] for e in sorted(live))

    def clear(self) -> None:
        self._heap.clear()
        self._token.clear()

    def _compact(self) -> None:
        tok = self._token
        self._heap = [e for e in self._heap if tok.get(e[2]) == e[1]]
        heapq.heapify(self._heap)


class BucketQueue:
    __slots__ = ("_heap", "_buckets", "_where")

    def __init__(self) -> None:
        self._heap: list[tuple] = []                 # (priority, bucket serial)
        self._buckets: dict[Any, dict[int, None]] = {}  # priority -> blocks, FIFO
        self._where: dict[int, Any] = {}             # block -> its priority

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, block: int) -> bool:
        return block in self._where

    def push(self, block: int, priority: Any) -> None:
        if block in self._where:
            self.remove(block)
        bucket = self._buckets.get(priority)
        if bucket is None:
            bucket = self._buckets[priority] = {}
            heapq.heappush(self._heap, priority)
        bucket[block] = None
        self._where[block] = priority

    def push_many(self, blocks, priority: Any) -> None:
        """Push blocks that are not queued yet, in order, all with ``priority``."""
        bucket = self._buckets.get(priority)
        if bucket is None:
            bucket = self._buckets[priority] = {}
            heapq.heappush(self._heap, priority)
        where = self._where
        for b in blocks:
            bucket[b] = None
            where[b] = priority

    def remove(self, block: int) -> bool:
        pri = self._where.pop(block, None)
        if pri is None:
            return False
        buckets = self._buckets
        bucket = buckets[pri]
        del bucket[block]
        if not bucket:
            del buckets[pri]  # its heap entry is dropped when it surfaces, or compacted
            if len(self._heap) > 64 + 2 * len(buckets):
                self._heap = list(buckets)
                heapq.heapify(self._heap)
        return True

    def peek_priority(self) -> Any:
        heap, buckets = self._heap, self._buckets
        while heap:
            if heap[0] in buckets:
                return heap[0]
            heapq.heappop(heap)
        return None

    def pop(self) -> int | None:
        pri = self.peek_priority()
        if pri is None:
            return None
        bucket = self._buckets[pri]
        b = next(iter(bucket))
        del bucket[b]
        del self._where[b]
        if not bucket:
            del self._buckets[pri]
            heapq.heappop(self._heap)
        return b

    def priority(self, block: int) -> Any:
        return self._where[block]

    def ordered(self) -> Iterator[int]:
        for pri in sorted(self._buckets):
            yield from list(self._buckets[pri])

    def clear(self) -> None:
        self._heap.clear()
        self._buckets.clear()
        self._where.clear()
