"""The node agent's patched allocation path inside vLLM: its cost against stock vLLM.

The first 3000 Mooncake requests (hash ids mapped to random 16-token blocks) driven through
vLLM 0.32's real ``KVCacheManager`` (admit, decode as one allocation, free), stock and with
the ``lru`` policy attached by the plugin's patch, at 10 % of the unique blocks; reports
CPU microseconds per request for both and the difference per evicted block (best of
``--repeat``).

    .venv/bin/python -m bench.bench_vllm_patch [--repeat 3] [--out bench/results/pool_vllm.json]
"""

from __future__ import annotations

import argparse
import sys
import time

from anchorage import workloads
from bench import harness


def vllm_patch_bench(repeat: int, n_requests: int = 3000) -> dict:
    import random

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from anchorage.node_agent import vllm_block_pool, vllm_hooks
    from anchorage.policies.lru import LRUPolicy

    wl = workloads.load("mooncake")
    bs, scale = 16, wl.block_size
    rng = random.Random(0)
    table: dict = {}
    reqs = []
    for c in wl.contexts[:n_requests]:
        toks = []
        for k in c.keys:
            blk = table.get(k)
            if blk is None:
                blk = table[k] = [rng.randrange(1, 30000) for _ in range(bs)]
            toks.extend(blk)
        tail = c.input_length - (len(c.keys) - 1) * scale
        prompt = (len(c.keys) - 1) * bs + max(1, min(bs, -(-tail * bs // scale)))
        reqs.append((toks[:prompt], max(1, c.output_length * bs // scale)))
    unique = len({k for c in wl.contexts[:n_requests] for k in c.keys})
    capacity = max(300, unique // 10)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)
    vllm_hooks.install(None)

    def one(driven: bool) -> tuple[float, int]:
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8,
                                 dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=capacity + 1, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
        mgr = KVCacheManager(cfg, max_model_len=1 << 20, scheduler_block_size=bs,
                             hash_block_size=bs, enable_caching=True)
        if driven:
            vllm_block_pool.attach(mgr.block_pool, LRUPolicy())
        # requests (and their block hashes) are built outside the timed region
        objs = [Request(str(i), t, SamplingParams(max_tokens=o), None, block_hasher=hasher)
                for i, (t, o) in enumerate(reqs)]
        v0 = vllm_block_pool.STATS.victims + vllm_block_pool.STATS.stock_victims
        t0 = time.process_time()
        for req, (toks, out) in zip(objs, reqs):
            blocks, hit, _ = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, len(toks) - hit, hit, blocks) is None:
                continue
            req.num_computed_tokens = len(toks)
            if out > 1:
                req.append_output_token_ids(list(range(10**7, 10**7 + out - 1)))
                mgr.allocate_slots(req, out - 1)
            mgr.free(req)
        dt = time.process_time() - t0
        return dt, vllm_block_pool.STATS.victims + vllm_block_pool.STATS.stock_victims - v0

    stock_s = min(one(False)[0] for _ in range(repeat))
    runs = [one(True) for _ in range(repeat)]
    lru_s = min(r[0] for r in runs)
    evicted = runs[0][1]
    n = len(reqs)
    return {"benchmark": "node_agent_patch", "workload": "mooncake[:%d] at 16-token blocks" % n,
            "capacity_blocks": capacity, "requests": n, "evicted_blocks": evicted,
            "stock_us_per_request": stock_s / n * 1e6, "lru_us_per_request": lru_s / n * 1e6,
            "overhead_pct": (lru_s / stock_s - 1) * 100,
            "extra_us_per_evicted_block": (lru_s - stock_s) / max(evicted, 1) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/pool_vllm.json")
    args = ap.parse_args()
    try:
        res = vllm_patch_bench(args.repeat)
    except (ImportError, workloads.WorkloadUnavailable) as exc:
        print(f"[skip] vllm patch benchmark: {exc}", file=sys.stderr)
        return 1
    print(f"{res['workload']}, capacity {res['capacity_blocks']} blocks, "
          f"{res['evicted_blocks']} evicted blocks")
    print(f"stock vLLM  {res['stock_us_per_request']:8.1f} us/request (CPU)")
    print(f"lru policy  {res['lru_us_per_request']:8.1f} us/request (CPU), "
          f"{res['overhead_pct']:+.1f} %, {res['extra_us_per_evicted_block']:+.2f} us "
          f"per evicted block")
    harness.write_json(args.out, res)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
