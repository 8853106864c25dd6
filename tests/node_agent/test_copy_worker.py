"""The CPU transfer worker's copies (``node_agent.offload.worker.TorchCopyWorker``) byte for
byte, for page sizes that take each width of ``wide`` (8, 4, 2 and 1 bytes), layer
references smaller than their tensor's page, and host chunks of several blocks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402

from anchorage.node_agent.offload.worker import TorchCopyWorker, wide  # noqa: E402


@pytest.mark.parametrize("page,dtype", [(64, torch.int64), (36, torch.int32),
                                        (22, torch.int16), (7, torch.int8)])
def test_wide_views_the_same_bytes_as_the_widest_integer_type(page, dtype):
    a = torch.arange(5 * page, dtype=torch.int64).to(torch.int8).view(5, page)
    b = torch.zeros(9, page, dtype=torch.int8)
    wa, wb = wide(a, b)
    assert wa.dtype == dtype and wb.dtype == dtype
    assert wa.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    # a column slice whose row stride is a multiple of 8 but its width is not stays narrower
    na, _ = wide(a[:, :page - 1] if page > 1 else a, b[:, :page - 1] if page > 1 else b)
    assert na.element_size() < 8


@pytest.mark.parametrize("page,ref_pages,bpc", [(64, (64,), 1), (64, (64, 40), 2),
                                                (36, (36,), 3), (7, (7, 5), 2)])
def test_stores_and_loads_copy_exactly_the_blocks_named(page, ref_pages, bpc):
    g = torch.Generator().manual_seed(page + bpc)
    dev = torch.randint(-128, 127, (12, page), dtype=torch.int8, generator=g)
    kv = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=dev, page_size_bytes=page)],
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=n)
                          for n in ref_pages]])
    w = TorchCopyWorker(kv, bpc, num_chunks=6)
    n = max(ref_pages)
    host = w.host[0]
    # store device blocks 3, 7, 8 (starting one sub-block into host chunk 4 when bpc > 1)
    blocks, skip = [3, 7, 8], 1 % bpc
    chunks = [4, 1] if bpc > 1 else [4, 1, 2]
    w.submit_store(1, GPULoadStoreSpec(blocks, group_sizes=[3], block_indices=[skip]),
                   CPULoadStoreSpec(chunks))
    rows = [c * bpc + j for c in chunks for j in range(bpc)][skip:skip + 3]
    for b, r in zip(blocks, rows):
        assert torch.equal(host[r, :n], dev[b, :n])
    untouched = set(range(host.shape[0])) - set(rows)
    assert all(not host[r].any() for r in untouched)
    # load them back into other device blocks
    before = dev.clone()
    w.submit_load(2, CPULoadStoreSpec(chunks),
                  GPULoadStoreSpec([0, 1, 11], group_sizes=[3], block_indices=[skip]))
    for src, dst in zip(blocks, [0, 1, 11]):
        assert torch.equal(dev[dst, :n], before[src, :n])
        assert torch.equal(dev[dst, n:], before[dst, n:])   # bytes past the refs: kept
    others = [i for i in range(12) if i not in (0, 1, 11)]
    assert torch.equal(dev[others], before[others])
    assert w.counts["bytes_d2h"] == w.counts["bytes_h2d"] == sum(ref_pages) * 3
    assert [r.job_id for r in w.get_finished()] == [1, 2]
