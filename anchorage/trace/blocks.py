"""Chained-prefix block ids: the ``hash_ids`` of anchorage-trace/v1.

An id stands for a whole prompt prefix, not for one block's content: block i of two
prompts gets the same id exactly when the two prompts are equal through block i. Ids are
assigned by a trie, ``(parent id, block content) -> id``, so they are small dense ints
(as in Mooncake's remapped ids) and never collide, unlike content hashes.

``PrefixIds`` is shared by the generator and the text/positional converters; a block's
``content`` is any hashable that determines its tokens (a tuple of token ids, a tuple of
``(chunk key, offset, length)`` pieces, ``(session, position, version)``...).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

ROOT = -1  # parent of the first block of every prompt


class PrefixIds:
    """Assigns chained-prefix ids: ``child(parent, content)`` is stable and injective."""

    __slots__ = ("_ids", "_next")

    def __init__(self, first_id: int = 0):
        self._ids: dict[tuple[int, Hashable], int] = {}
        self._next = first_id

    def __len__(self) -> int:
        return len(self._ids)

    def child(self, parent: int, content: Hashable) -> int:
        key = (parent, content)
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = self._next
            self._next += 1
        return got

    def extend(self, chain: list[int], contents: Iterable[Hashable]) -> list[int]:
        """Append the ids of ``contents`` after ``chain`` (in place) and return it."""
        parent = chain[-1] if chain else ROOT
        for c in contents:
            parent = self.child(parent, c)
            chain.append(parent)
        return chain

    def chain(self, contents: Iterable[Hashable]) -> list[int]:
        return self.extend([], contents)

    def fresh(self) -> int:
        """An id no prompt shares (arrival-only traces, unique suffixes)."""
        got = self._next
        self._next += 1
        return got


def token_blocks(tokens: Sequence[Hashable], block_size: int) -> list[tuple]:
    """Split a token sequence into block contents (the last one may be partial)."""
    return [tuple(tokens[i:i + block_size]) for i in range(0, len(tokens), block_size)]


def n_blocks(tokens: int, block_size: int) -> int:
    """Blocks covering ``tokens`` tokens, a partial last block included (Mooncake's rule)."""
    return -(-tokens // block_size)
