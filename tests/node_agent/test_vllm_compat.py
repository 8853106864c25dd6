"""``node_agent.vllm_compat`` against the installed vLLM, and the hooks it drives.

The table must describe the installed vLLM (every hooked or relied-on callable exists,
every other method of ``BlockPool`` / ``KVCacheManager`` is classified), install and
uninstall must follow it, and the hooks vLLM's upstream tests barely reach
(``unpin_blocks``, ``move_block_hashes``, ``cache_partial_block``, ``evict_blocks``,
``pop_blocks_for_free``, ``get_computed_blocks_for_connector``) must keep the policy's view
equal to the pool: the blocks the policy holds are the pool's free cached blocks, under
``lru`` in vLLM's own free-queue order, with no policy error.
"""

from __future__ import annotations

import pytest

from anchorage.node_agent import vllm_block_pool, vllm_compat, vllm_hooks
from anchorage.policies.lru import LRUPolicy
from anchorage.policies.registry import make_policy
from tests.pool.vllm_side import VllmSide, vllm_kv  # noqa: F401 (fixture)

BS = 4


@pytest.fixture()
def hooks(vllm_kv):
    """The pool hooks installed (no default policy), as before afterwards."""
    was, prev = vllm_compat.installed("pool"), vllm_hooks.engine_config()
    vllm_hooks.install(None)
    yield
    if not was:
        vllm_hooks.uninstall()
    vllm_hooks.configure(prev)


class Recorder(LRUPolicy):
    """``lru`` that records the notifications vLLM's re-keying sends."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def on_request(self, ctx):
        self.seen.append(("request", ctx.request_id))

    def on_cached(self, ctx, blocks, keys, start):
        self.seen.append(("cached", ctx.request_id, list(blocks), start))

    def on_evicted(self, block, key):
        self.seen.append(("evicted", block))

    def on_request_done(self, ctx):
        self.seen.append(("done", ctx.request_id))


def side_with(v, policy, capacity=12):
    side = VllmSide(v, capacity, BS)
    return side, vllm_block_pool.attach(side.pool, policy)


def request(v, side, rid, n_tokens, first=1):
    return v.Request(rid, list(range(first, first + n_tokens)), v.SamplingParams(max_tokens=2),
                     None, block_hasher=side.hasher)


def admit(side, req):
    blocks, hit, _ = side.mgr.get_computed_blocks(req)
    assert side.mgr.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
    req.num_computed_tokens = req.num_tokens


def assert_in_step(d):
    """The policy holds exactly the pool's free cached blocks, in vLLM's order (lru)."""
    order = vllm_compat.cached_free_block_ids(d.pool)
    assert d.evictable == set(order)
    if d.policy.name in ("lru", "base"):
        assert list(d.policy.eviction_order()) == order


# -- the table ------------------------------------------------------------------------------


def test_the_table_describes_the_installed_vllm(vllm_kv):
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    assert vllm_compat.unsupported_reason("pool") is None
    assert vllm_compat.unsupported_reason("scheduler") is None
    keys = [h.key for h in vllm_compat.HOOKS]
    assert len(keys) == len(set(keys))
    for h in vllm_compat.HOOKS:
        if h.replacement is not None:
            assert callable(vllm_compat._resolve(h.replacement)), h
    hooked = set(keys)
    for cls in (BlockPool, KVCacheManager):
        own = {f"{cls.__name__}.{n}" for n, f in vars(cls).items()
               if (callable(f) or isinstance(f, property))
               and (n == "__init__" or not n.startswith("__"))}
        unclassified = own - hooked - set(vllm_compat.UNHOOKED)
        assert not unclassified, f"new vLLM methods: hook them or say why not: {unclassified}"
        stale = {k for k in vllm_compat.UNHOOKED if k.startswith(cls.__name__ + ".")} - own
        assert not stale, f"UNHOOKED names methods vLLM no longer has: {stale}"


def test_install_and_uninstall_follow_the_table(hooks):
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    rows = [h for h in vllm_compat.HOOKS if h.group == "pool" and h.replacement]
    owners = {"BlockPool": BlockPool, "KVCacheManager": KVCacheManager}
    assert vllm_compat.installed("pool")
    for h in rows:
        assert getattr(owners[h.key.split(".")[0]], h.name) is vllm_compat._resolve(
            h.replacement), h.key
    vllm_hooks.uninstall()
    try:
        assert not vllm_compat.installed("pool") and not vllm_compat.ORIGINALS.keys() & {
            h.key for h in rows}
        for h in rows:
            fn = getattr(owners[h.key.split(".")[0]], h.name)
            assert fn.__module__.startswith("vllm."), h.key
    finally:
        vllm_hooks.install(None)


def test_an_unsupported_version_names_itself(monkeypatch, vllm_kv):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    for group in ("pool", "scheduler"):
        assert "vLLM 0.33.0 is not a supported version (0.32.x)" == (
            vllm_compat.unsupported_reason(group))


def test_group_suffix_is_vllms_key_layout(vllm_kv):
    from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

    h = BlockHash(b"\x01" * 32)
    for g in (0, 1, 7, 300):
        assert make_block_hash_with_group_id(h, g) == h + vllm_compat.group_suffix(g)


# -- bytes per block ------------------------------------------------------------------------


def test_kv_block_bytes_from_the_cache_config(vllm_kv):
    import torch
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec, KVCacheTensor, MambaSpec)

    attn = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16)
    tensors = [KVCacheTensor(size=10 * 4096, layers=[n], layer_stride=0, block_stride=4096)
               for n in ("a", "b")]
    cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=tensors,
                        kv_cache_groups=[KVCacheGroupSpec(["a", "b"], attn)])
    assert vllm_compat.kv_block_bytes(cfg) == 8192  # the tensors over the blocks
    one = KVCacheConfig(num_blocks=10, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["a", "b"], attn)])
    assert vllm_compat.kv_block_bytes(one) == 2 * attn.page_size_bytes  # page x layers
    mamba = MambaSpec(block_size=16, shapes=((2, 8), (4,)), dtypes=(torch.float16,) * 2)
    for groups in ([KVCacheGroupSpec(["m"], mamba)],
                   [KVCacheGroupSpec(["a"], attn), KVCacheGroupSpec(["m"], mamba)]):
        cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=[], kv_cache_groups=groups)
        assert vllm_compat.kv_block_bytes(cfg) == 0  # unknown, no exception
    bad = MambaSpec(block_size=16, shapes=(3,), dtypes=(torch.float16,))  # an upstream test's
    cfg = KVCacheConfig(num_blocks=10, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["m"], bad)])
    with pytest.raises(TypeError):
        bad.page_size_bytes  # what vLLM itself raises on it
    assert vllm_compat.kv_block_bytes(cfg) == 0
    assert vllm_compat.kv_block_bytes(object()) == 0


# -- the hooks keep the policy's view equal to the pool -------------------------------------


def test_unpinned_cached_blocks_are_the_policys_in_vllms_order(hooks, vllm_kv):
    v = vllm_kv
    side, d = side_with(v, LRUPolicy())
    errors0 = vllm_block_pool.STATS.errors
    a, b = request(v, side, "a", 3 * BS), request(v, side, "b", 2 * BS, first=100)
    admit(side, a)
    admit(side, b)
    pinned = list(side.mgr.get_blocks("a").blocks[0])
    side.pool.touch(pinned)  # a reader keeps a's blocks (as vLLM's HiSparse does)
    side.mgr.free(b)
    side.mgr.free(a)  # still referenced: not free yet
    assert not d.evictable & {blk.block_id for blk in pinned}
    reused = []
    side.pool.unpin_blocks(pinned, reused.append)
    assert_in_step(d)  # unpinned after b's blocks: behind them, as vLLM queued them
    assert d.evictable >= {blk.block_id for blk in pinned}
    side.pool.get_new_blocks(side.pool.get_num_free_blocks())  # everything goes
    assert {blk.block_id for blk in reused} == {blk.block_id for blk in pinned}
    assert_in_step(d)
    assert vllm_block_pool.STATS.errors == errors0


def test_copy_on_write_moves_the_key_to_the_copy(hooks, vllm_kv):
    v = vllm_kv
    side, d = side_with(v, Recorder())
    errors0 = vllm_block_pool.STATS.errors
    a = request(v, side, "a", 2 * BS)
    admit(side, a)
    src = side.mgr.get_blocks("a").blocks[0][1]
    key, bid = src.block_hash, src.block_id
    assert key is not None
    (dst,) = side.pool.get_new_blocks(1)
    d.policy.seen.clear()
    side.pool.move_block_hashes(src, dst)
    assert src.block_hash is None and dst.block_hash == key
    assert d.policy.seen == [("evicted", bid), ("cached", None, [dst.block_id], 1)]
    side.mgr.free(a)
    side.pool.free_blocks([dst])
    assert_in_step(d)  # the copy is evictable, the written block is not cached
    assert dst.block_id in d.evictable and bid not in d.evictable
    assert vllm_block_pool.STATS.errors == errors0


def test_a_partial_entry_on_a_free_block_is_handed_over(hooks, vllm_kv):
    v = vllm_kv
    side, d = side_with(v, Recorder())
    errors0 = vllm_block_pool.STATS.errors
    a = request(v, side, "a", 2 * BS + 1)
    free = vllm_compat.uncached_head(side.pool, 1)[0]
    d.policy.seen.clear()
    key = side.pool.cache_partial_block(request=a, block=free, num_tokens=2 * BS,
                                        kv_cache_group_id=0, block_size=2 * BS)
    assert free.block_hash == key is not None
    assert ("request", "a") in d.policy.seen  # announced before its block moved
    assert ("cached", "a", [free.block_id], 1) in d.policy.seen
    assert free.block_id in d.evictable  # free and cached: the policy may evict it
    assert d.evictable == set(vllm_compat.cached_free_block_ids(side.pool))
    assert vllm_block_pool.STATS.errors == errors0


def test_blocks_a_connector_evicts_while_free_are_withdrawn(hooks, vllm_kv):
    v = vllm_kv
    side, d = side_with(v, make_policy("hybrid", block_size=BS))
    errors0 = vllm_block_pool.STATS.errors
    a = request(v, side, "a", 3 * BS)
    admit(side, a)
    ids = [blk.block_id for blk in side.mgr.get_blocks("a").blocks[0]]
    side.mgr.free(a)
    assert set(ids) <= d.evictable
    side.mgr.evict_blocks({ids[0], ids[2]})
    assert_in_step(d)
    assert d.evictable & set(ids) == {ids[1]}
    side.pool.get_new_blocks(side.pool.get_num_free_blocks())
    assert_in_step(d)
    assert vllm_block_pool.STATS.errors == errors0


def test_a_deferred_free_ends_the_request_now_and_frees_later(hooks, vllm_kv):
    v = vllm_kv
    side, d = side_with(v, Recorder())
    a = request(v, side, "a", 2 * BS)
    admit(side, a)
    blocks = side.mgr.pop_blocks_for_free(a)
    assert d.policy.seen[-1] == ("done", "a") and "a" not in d.contexts
    assert not d.evictable
    side.pool.free_blocks(reversed(blocks))  # the scheduler's deferred free, later
    assert_in_step(d)
    assert len(d.evictable) == 2


def hybrid_mamba_manager(v, capacity=16):
    """A full-attention + Mamba model's manager (vLLM's connector lookup has its own path
    for it; bytes per block are unknown for it)."""
    from vllm.v1.kv_cache_interface import MambaSpec

    attn = v.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8,
                               dtype=v.torch.float16)
    mamba = MambaSpec(block_size=BS, shapes=((1, 1),), dtypes=(v.torch.float32,))
    cfg = v.KVCacheConfig(num_blocks=capacity + 1, kv_cache_tensors=[],
                          kv_cache_groups=[v.KVCacheGroupSpec(["attn"], attn),
                                           v.KVCacheGroupSpec(["mamba"], mamba)])
    return v.KVCacheManager(cfg, max_model_len=1 << 12, scheduler_block_size=BS,
                            hash_block_size=BS, enable_caching=True)


def test_the_connector_lookup_announces_a_request_once(hooks, vllm_kv):
    v = vllm_kv
    for mgr in (VllmSide(v, 12, BS).mgr, hybrid_mamba_manager(v)):
        d = vllm_block_pool.attach(mgr.block_pool, Recorder())
        errors0 = vllm_block_pool.STATS.errors
        a = v.Request("a", list(range(1, 2 * BS + 1)), v.SamplingParams(max_tokens=2), None,
                      block_hasher=v.get_request_block_hasher(BS, v.sha256))
        blocks, hit, *_ = mgr.get_computed_blocks_for_connector(a)
        assert d.policy.seen == [("request", "a")]  # at the lookup, as the plain one
        mgr.get_computed_blocks(a)  # the next scheduling attempt: nothing new
        assert mgr.allocate_slots(a, a.num_tokens - hit, hit, blocks) is not None
        assert [s for s in d.policy.seen if s[0] == "request"] == [("request", "a")]
        assert vllm_block_pool.STATS.errors == errors0
    assert d.view.bytes_per_block == -1  # the Mamba config's: unknown, no error


def test_allocation_without_a_lookup_and_odd_touches_raise_nothing(hooks, vllm_kv):
    """vLLM's tests allocate without a prefix lookup and touch free uncached blocks (and a
    block twice): under ``hybrid`` this raised KeyError in the policy before."""
    v = vllm_kv
    side, d = side_with(v, make_policy("hybrid", block_size=BS), capacity=6)
    errors0 = vllm_block_pool.STATS.errors
    for i in range(4):
        r = request(v, side, f"r{i}", 3 * BS - 1, first=1 + 50 * i)  # 2 full + 1 partial
        assert side.mgr.allocate_slots(r, r.num_tokens) is not None
        side.mgr.free(r)
        assert_in_step(d)
    head = vllm_compat.uncached_head(side.pool, 1)
    side.pool.touch(head + head)
    side.pool.free_blocks(head + head)
    assert_in_step(d)
    assert vllm_block_pool.STATS.errors == errors0
    assert vllm_block_pool.STATS.victims > 0  # the policy did choose
