"""A model of vLLM v1's prefix-cached block pool (``vllm/v1/core/block_pool.py``, 0.32).

It keeps vLLM's semantics exactly, over trace block keys instead of token hashes:

- ``capacity_blocks`` usable blocks, ids ``1..capacity_blocks`` (vLLM reserves block 0 as
  the null block, so it corresponds to ``num_gpu_blocks = capacity_blocks + 1``).
- Only full blocks are cached. A prefix hit is the longest run of leading blocks that are
  all cached, stopping at the first miss, and capped so that at least the last prompt
  token is recomputed: at most ``(num_prompt_tokens - 1) // block_size`` blocks.
- Blocks held by running requests are referenced (``ref_cnt > 0``) and never evicted.
- The free queue holds the free blocks in eviction order. When a request frees its blocks
  (in reverse chain order: a chain's tail before its head), blocks without a hash are
  prepended (LIFO reuse) and cached ones appended (LRU). A hit on a free block removes it
  from the queue (``touch``).
- Allocation pops free blocks from the head; popping a cached block evicts it (its hash is
  dropped). Cached blocks are not de-duplicated: recomputing a block whose key is already
  cached caches a second physical block under the same key; lookups take the first one.

Invariant: the free queue is always [uncached blocks..., cached blocks...]. The uncached
part is kept here as a stack; the cached part is the eviction policy's business. With
the ``lru`` policy the combined order is exactly vLLM's; any other policy only changes
which cached free block is evicted, never the rest of the mechanics. That is precisely
what the node-agent plugin changes inside the real engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

from anchorage.policies.base import EvictionPolicy, RequestContext

Key = Hashable


def batch_victims(policy: EvictionPolicy):
    """The policy's ``pop_victims(n)`` when it may stand in for ``n`` calls of its
    ``pop_victim`` (the class that defines ``pop_victim`` defines it too, so a subclass
    that overrides only ``pop_victim`` is never bypassed); else None."""
    fn = getattr(policy, "pop_victims", None)
    if fn is None:
        return None
    for klass in type(policy).__mro__:
        if "pop_victim" in klass.__dict__:
            return fn if "pop_victims" in klass.__dict__ else None
    return None


class PoolError(RuntimeError):
    """A request cannot be placed (not enough free blocks) or the pool was misused."""


@dataclass(slots=True)
class Allocation:
    """The blocks one request holds, in chain order, and how many of them it hit."""

    ctx: RequestContext
    blocks: list[int] = field(default_factory=list)
    hit_blocks: int = 0
    num_cached: int = 0  # leading blocks of `blocks` that carry a key
    keys: list[Key] = field(default_factory=list)  # key per cached block


@dataclass(slots=True)
class PoolStats:
    requests: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    policy_errors: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class BlockPool:
    """vLLM's block pool over trace keys, with eviction delegated to a policy."""

    def __init__(self, capacity_blocks: int, block_size: int, policy: EvictionPolicy):
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        self.capacity_blocks = capacity_blocks
        self.block_size = block_size
        self.policy = policy
        n = capacity_blocks + 1
        self.ref_cnt = [0] * n
        self.block_key: list[Key | None] = [None] * n
        # key -> block id, or dict {block id: None} (insertion ordered) for duplicates
        self.cached: dict[Key, Any] = {}
        # uncached free blocks; the queue's head is the end of this list
        self._uncached_free: list[int] = list(range(capacity_blocks, 0, -1))
        self._num_cached_free = 0
        self._synthetic = 0  # counter for keys of generated-token blocks
        self.stats = PoolStats()
        policy.attach(self)
        # Fast paths, chosen once: a policy whose victims do not depend on eviction
        # notifications may hand over several at once (``pop_victims``), and a pool
        # class that does not hook ``_evict`` (e.g. to emit events) evicts inline.
        self._pop_victims = batch_victims(policy)
        self._inline_evict = type(self)._evict is BlockPool._evict
        self._notify_evicted = type(policy).on_evicted is not EvictionPolicy.on_evicted
        self._notify_cached = type(policy).on_cached is not EvictionPolicy.on_cached

    # -- queries --------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._uncached_free) + self._num_cached_free

    @property
    def num_cached_free_blocks(self) -> int:
        return self._num_cached_free

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.capacity_blocks

    def get_cached_block(self, key: Key) -> int | None:
        b = self.cached.get(key)
        if b is None or type(b) is int:
            return b
        return next(iter(b))

    def num_hit_blocks(self, keys: Sequence[Key], num_prompt_tokens: int) -> int:
        """Longest cached prefix, capped one token short of the whole prompt."""
        limit = min(len(keys), (num_prompt_tokens - 1) // self.block_size) if num_prompt_tokens else 0
        cached = self.cached
        n = 0
        while n < limit and keys[n] in cached:
            n += 1
        return n

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- request lifecycle ----------------------------------------------------------------

    def allocate(self, ctx: RequestContext, num_tokens: int | None = None) -> Allocation | None:
        """Admit a request: find its prefix hit, touch the hit blocks, allocate the rest for
        ``num_tokens`` tokens (default: the prompt) and cache its full prompt blocks.

        Returns None (and changes nothing) when there are not enough free blocks, like
        vLLM's ``allocate_slots``.
        """
        keys = ctx.keys
        prompt = ctx.input_length
        if num_tokens is None:
            num_tokens = prompt
        self.policy.on_request(ctx)
        hit = self.num_hit_blocks(keys, prompt)
        cached = self.cached
        hit_blocks = [cached[k] for k in keys[:hit]]
        for i, b in enumerate(hit_blocks):
            if type(b) is not int:  # duplicates: lookups take the first copy
                hit_blocks[i] = next(iter(b))
        need = -(-num_tokens // self.block_size) - hit
        # hit blocks that are free stop being free when touched
        ref = self.ref_cnt
        evictable_hits = 0
        for b in hit_blocks:
            if ref[b] == 0:
                evictable_hits += 1
        if need > len(self._uncached_free) + self._num_cached_free - evictable_hits:
            return None
        alloc = Allocation(ctx=ctx, hit_blocks=hit)
        self._touch(hit_blocks, ctx)
        alloc.blocks = hit_blocks + self._get_new_blocks(need, ctx)
        alloc.num_cached = hit
        alloc.keys = list(keys[:hit])
        self.cache_full_blocks(alloc, min(len(keys), prompt // self.block_size))
        st = self.stats
        st.requests += 1
        st.prompt_blocks += len(keys)
        st.hit_blocks += hit
        st.prompt_tokens += prompt
        st.hit_tokens += hit * self.block_size
        return alloc

    def grow(self, alloc: Allocation, num_tokens: int) -> bool:
        """Make room for ``num_tokens`` tokens in total (decode). False if out of blocks."""
        need = self.blocks_needed(num_tokens) - len(alloc.blocks)
        if need <= 0:
            return True
        if need > self.num_free_blocks:
            return False
        alloc.blocks.extend(self._get_new_blocks(need, alloc.ctx))
        return True

    def cache_generated_blocks(self, alloc: Allocation, num_computed_tokens: int) -> None:
        """Cache the blocks filled by generated tokens under fresh keys (vLLM hashes them;
        no trace can name them, so they are never hit again, but they occupy the cache)."""
        full = num_computed_tokens // self.block_size
        while len(alloc.keys) < min(full, len(alloc.blocks)):
            self._synthetic -= 1
            alloc.keys.append(("gen", self._synthetic))
        self.cache_full_blocks(alloc, min(full, len(alloc.blocks)), alloc.keys)

    def cache_full_blocks(self, alloc: Allocation, num_full: int,
                          keys: Sequence[Key] | None = None) -> None:
        keys = alloc.ctx.keys if keys is None else keys
        start = alloc.num_cached
        if num_full <= start:
            return
        new_ids = alloc.blocks[start:num_full]
        new_keys = list(keys[start:num_full])
        if len(new_keys) != len(new_ids):
            raise PoolError(f"request {alloc.ctx.request_id!r}: {len(new_ids)} blocks to cache, "
                            f"{len(new_keys)} keys")
        bkey = self.block_key
        cached = self.cached
        for b, k in zip(new_ids, new_keys):
            if bkey[b] is not None:
                raise PoolError(f"block {b} is cached already")
            bkey[b] = k
            cur = cached.get(k)
            if cur is None:
                cached[k] = b
            elif type(cur) is int:
                cached[k] = {cur: None, b: None}
            else:
                cur[b] = None
        if len(alloc.keys) < num_full:
            alloc.keys.extend(keys[len(alloc.keys):num_full])
        alloc.num_cached = num_full
        if new_ids and self._notify_cached:
            self.policy.on_cached(alloc.ctx, new_ids, new_keys, start)

    def free(self, alloc: Allocation) -> None:
        """Release a request's blocks in reverse chain order (tail first)."""
        ctx = alloc.ctx
        to_front: list[int] = []
        to_back: list[int] = []
        ref = self.ref_cnt
        bkey = self.block_key
        for b in reversed(alloc.blocks):
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                if bkey[b] is None:
                    to_front.append(b)
                else:
                    to_back.append(b)
            elif r < 0:
                raise PoolError(f"block {b} freed twice")
        alloc.blocks = []
        # prepend_n keeps list order at the head: the head of the stack is its end
        self._uncached_free.extend(reversed(to_front))
        if to_back:
            self._num_cached_free += len(to_back)
            self.policy.on_freed(ctx, to_back)
        self.policy.on_request_done(ctx)

    def reset_prefix_cache(self) -> bool:
        """Drop every hash; only allowed when no block is in use (as in vLLM)."""
        if self.num_free_blocks != self.capacity_blocks:
            return False
        order = self.policy_order_snapshot()
        self.policy.reset()
        for b in range(1, self.capacity_blocks + 1):
            self.block_key[b] = None
        self.cached.clear()
        # cached free blocks keep their queue position, now without a hash
        self._uncached_free = list(reversed(list(reversed(self._uncached_free)) + order))
        self._num_cached_free = 0
        return True

    def policy_order_snapshot(self) -> list[int]:
        """Cached free blocks in the policy's current eviction order (tests, reset)."""
        return list(self.policy.eviction_order())

    def free_queue_order(self) -> list[int]:
        """The whole free queue, head (next allocated) first, as vLLM's
        ``FreeKVCacheBlockQueue.get_all_free_blocks`` lists it (tests; O(n))."""
        return self._uncached_free[::-1] + self.policy_order_snapshot()

    # -- internals ------------------------------------------------------------------------

    def _touch(self, blocks: list[int], ctx: RequestContext) -> None:
        ref = self.ref_cnt
        was_free = []
        for b in blocks:
            if ref[b] == 0:
                was_free.append(b)
            ref[b] += 1
        if was_free:
            self._num_cached_free -= len(was_free)
        if blocks:
            self.policy.on_hit(ctx, blocks, was_free)

    def _get_new_blocks(self, n: int, ctx: RequestContext) -> list[int]:
        if n <= 0:
            return []
        uncached = self._uncached_free
        ref = self.ref_cnt
        k = min(n, len(uncached))
        if k:  # the head of the queue is the end of the stack
            out = uncached[-k:]
            del uncached[-k:]
            out.reverse()
            for b in out:
                ref[b] = 1
        else:
            out = []
        m = n - k
        if not m:
            return out
        if self._pop_victims is None or not self._inline_evict:
            for _ in range(m):
                b = self._pick_victim()
                self._evict(b)
                ref[b] = 1
                out.append(b)
            return out
        # fast path: the policy hands over all victims at once; evict them inline
        victims = self._pop_victims(m)
        if len(victims) != m:
            raise PoolError(f"policy {self.policy.name} returned {len(victims)} victims, "
                            f"{m} were needed")
        self._num_cached_free -= m
        bkey = self.block_key
        cached = self.cached
        notify = self.policy.on_evicted if self._notify_evicted else None
        for b in victims:
            key = bkey[b]
            if key is None or ref[b] != 0:
                raise PoolError(f"policy {self.policy.name} returned an invalid victim {b!r}")
            bkey[b] = None
            cur = cached[key]
            if type(cur) is int:
                if cur == b:
                    del cached[key]
            else:
                cur.pop(b, None)
                if len(cur) == 1:
                    cached[key] = next(iter(cur))
                elif not cur:
                    del cached[key]
            ref[b] = 1
            if notify is not None:
                notify(b, key)
        self.stats.evictions += m
        out.extend(victims)
        return out

    def _pick_victim(self) -> int:
        b = self.policy.pop_victim()
        if b is None or self.ref_cnt[b] != 0 or self.block_key[b] is None:
            raise PoolError(f"policy {self.policy.name} returned an invalid victim {b!r}")
        self._num_cached_free -= 1
        return b

    def _evict(self, b: int) -> None:
        k = self.block_key[b]
        self.block_key[b] = None
        cur = self.cached.get(k)
        if type(cur) is int:
            if cur == b:
                del self.cached[k]
        elif cur is not None:
            cur.pop(b, None)
            if len(cur) == 1:
                self.cached[k] = next(iter(cur))
            elif not cur:
                del self.cached[k]
        self.stats.evictions += 1
        self.policy.on_evicted(b, k)

    # -- invariants (tests) ---------------------------------------------------------------

    def check_invariants(self) -> None:
        free_uncached = set(self._uncached_free)
        assert len(free_uncached) == len(self._uncached_free), "duplicate free block"
        cached_free = set(self.policy.eviction_order())
        assert len(cached_free) == self._num_cached_free, (
            f"policy tracks {len(cached_free)} free cached blocks, pool {self._num_cached_free}")
        assert not (free_uncached & cached_free)
        for b in range(1, self.capacity_blocks + 1):
            r = self.ref_cnt[b]
            assert r >= 0, f"block {b} has ref_cnt {r}"
            if r == 0:
                assert (b in free_uncached) or (b in cached_free), f"free block {b} lost"
                if b in free_uncached:
                    assert self.block_key[b] is None
                else:
                    assert self.block_key[b] is not None
            else:
                assert b not in free_uncached and b not in cached_free
        n_cached = 0
        for k, v in self.cached.items():
            ids = [v] if type(v) is int else list(v)
            assert ids, f"empty entry for {k!r}"
            for b in ids:
                assert self.block_key[b] == k
                n_cached += 1
        assert n_cached == sum(1 for b in range(1, self.capacity_blocks + 1)
                               if self.block_key[b] is not None)
