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

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.lru import LRUPolicy
from anchorage.pool.block_pool import BlockPool
from tests.conftest import repo_trace
from tests.pool.vllm_side import VllmSide, vllm_kv  # noqa: F401 (fixture)
from tests.pool.workload import Req, agent_workload, token_blocks

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
              max_running: int, p_one_shot: float, reqs: list[Req] | None = None
              ) -> dict[str, int]:
    rng = random.Random(seed)
    if reqs is None:
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


@pytest.mark.parametrize("max_running,capacity", [(1, 300), (4, 600)])
def test_lru_matches_vllm_on_mooncake(vllm_kv, max_running, capacity):
    """The first 300 requests of the real Mooncake conversation trace (chained hash ids,
    block size scaled from 512 to 16 tokens, partial last blocks kept)."""
    from anchorage.trace.format import read_trace

    header, records = read_trace(repo_trace("mooncake/conversation_trace.jsonl.xz"))
    bs, scale = 16, header.block_size
    reqs = []
    for i, r in enumerate(records[:300]):
        tail = r.input_length - (len(r.hash_ids) - 1) * scale  # tokens in the last block
        prompt = (len(r.hash_ids) - 1) * bs + max(1, min(bs, -(-tail * bs // scale)))
        reqs.append(Req(i, list(r.hash_ids), prompt, max(1, r.output_length * bs // scale)))
    counts = run_trace(vllm_kv, 5, bs, capacity, len(reqs), max_running, 0.5, reqs=reqs)
    assert counts["hit_tokens"] > 0 and counts["evictions"] > 0, counts
