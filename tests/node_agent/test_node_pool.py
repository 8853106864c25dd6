"""The node pool's index and data files (``anchorage.node_agent.offload.node_pool``) and the
transfer worker reading a peer's chunks, without an engine: two "engines" here are two sets
of objects over one directory (the files, locks and mappings are the real ones)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from anchorage.node_agent.offload.node_pool import PoolData, PoolIndex

torch = pytest.importorskip("torch")


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def index(d, eid, fp="model-a", n=8, clock=None):
    return PoolIndex(str(d), eid, fp, n, refresh_s=0.0, scan_s=0.0,
                     clock=clock or Clock())


def test_a_peer_finds_what_the_owner_published_until_it_is_evicted(tmp_path):
    a, b = index(tmp_path, "a"), index(tmp_path, "b")
    assert b.find(b"k1") is None
    a.publish(3, b"k1")
    assert b.find(b"k1") == ("a", 3, 2)
    assert a.find(b"k1") is None                 # an engine never reads itself as a peer
    a.retract(3)                                 # evicted: the slot is about to be rewritten
    assert b.find(b"k1") is None
    a.publish(3, b"k2")                          # the slot now holds another key
    assert b.find(b"k1") is None and b.find(b"k2") == ("a", 3, 4)
    a.publish(5, b"k1")
    assert b.find(b"k1") == ("a", 5, 2)
    a.retract_all()                              # vLLM's reset_cache
    assert b.find(b"k1") is None and b.find(b"k2") is None


def test_a_stale_table_entry_is_checked_at_the_lookup(tmp_path):
    clock = Clock()
    a = index(tmp_path, "a")
    b = PoolIndex(str(tmp_path), "b", "model-a", 8, refresh_s=10.0, scan_s=10.0, clock=clock)
    a.publish(1, b"k")
    assert b.find(b"k") == ("a", 1, 2)
    a.retract(1)                                 # b's table is not refreshed for 10 s
    assert b.find(b"k") is None and b.counts["peer_stale"] == 1


def test_engines_of_another_model_or_layout_are_not_peers(tmp_path):
    a = index(tmp_path, "a", fp="model-a")
    c = index(tmp_path, "c", fp="model-b")
    a.publish(0, b"k")
    assert c.find(b"k") is None and "a" not in c.peers


CHILD = """
import sys
from anchorage.node_agent.offload.node_pool import PoolData, PoolIndex
a = PoolIndex(sys.argv[1], "a", "model-a", 8)
d = PoolData(sys.argv[1], "a", 0, [64], 2, 8)
a.publish(0, b"k")
print("ready", flush=True)
sys.stdin.readline()
"""


def test_another_process_reads_it_and_its_files_go_when_it_dies(tmp_path):
    import subprocess
    import sys

    b = index(tmp_path, "b")
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert b.find(b"k") == ("a", 0, 2)         # published by another process
        b.refresh(force=True)
        assert "a" in b.peers                      # alive: its lock is held
    finally:
        p.stdin.close()                            # it exits without cleaning up
        p.wait(timeout=60)
    assert sorted(os.listdir(tmp_path)) == ["a.idx", "a.r0.kv", "b.idx"]
    b.refresh(force=True)                          # its locks went with it
    assert b.find(b"k") is None and "a" not in b.peers
    assert sorted(os.listdir(tmp_path)) == ["b.idx"]
    b.close()
    assert os.listdir(tmp_path) == []              # a clean shutdown removes its files


def test_a_directory_that_cannot_be_used_is_an_error_naming_it(tmp_path):
    from anchorage.node_agent.offload.node_pool import NodePoolError

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NodePoolError, match="node_pool_dir"):
        index(f / "sub", "a")


# -- the transfer worker over the pool ----------------------------------------------------


def caches(num_blocks=6, page=64, seed=0):
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-100, 100, (num_blocks, page), dtype=torch.int8, generator=g)
    return t, CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=page)],
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=page)]])


def worker(d, eid, seed, chunks=4):
    from anchorage.node_agent.offload.worker import TorchCopyWorker

    t, kv = caches(seed=seed)
    return t, TorchCopyWorker(kv, 1, chunks, pool=PoolData(str(d), eid, 0, [64], 1, chunks))


def gpu(ids):
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


def test_the_worker_loads_a_peers_chunk_and_fails_a_changed_one(tmp_path):
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    from anchorage.node_agent.offload.worker import NodeLoadStoreSpec

    ia, ib = index(tmp_path, "a"), index(tmp_path, "b")
    ta, wa = worker(tmp_path, "a", seed=1)
    tb, wb = worker(tmp_path, "b", seed=2)
    assert not torch.equal(ta, tb)
    # a stores its device blocks 0, 1 into its host chunks 2, 3 and publishes them
    wa.submit_store(1, gpu([0, 1]), CPULoadStoreSpec([2, 3]))
    ia.publish(2, b"k0")
    ia.publish(3, b"k1")
    # b stores its own block 5 in its chunk 0; then loads k0, k1 from a and its own chunk
    wb.submit_store(2, gpu([5]), CPULoadStoreSpec([0]))
    (e0, c0, v0), (_, c1, v1) = ib.find(b"k0"), ib.find(b"k1")
    spec = NodeLoadStoreSpec([c0, 0, c1], [0, -1, 0], [v0, 0, v1], [e0])
    before = tb[5].clone()
    wb.submit_load(3, spec, gpu([2, 3, 4]))
    assert torch.equal(tb[2], ta[0]) and torch.equal(tb[4], ta[1])
    assert torch.equal(tb[3], before)                    # its own chunk
    assert wb.take_load_errors() == set()
    assert wb.counts["peer_loads"] == 1 and wb.counts["peer_blocks"] == 2
    # a evicts k1's chunk after b's lookup: b's load fails, its blocks are recomputed
    ia.retract(3)
    tb[4].zero_()
    wb.submit_load(4, NodeLoadStoreSpec([c1], [0], [v1], [e0]), gpu([4]))
    assert wb.take_load_errors() == {4} and wb.counts["peer_stale"] == 1
    assert wb.failed_loads() == [4]
    assert [r.job_id for r in wb.get_finished()] == [2, 3, 4]   # every job reported
    # a peer that is gone (its files removed at its shutdown): the same, and its mapping
    # is dropped
    wa.shutdown()
    ia.close()
    wb.submit_load(5, NodeLoadStoreSpec([c0], [0], [v0], ["a"]), gpu([2]))
    assert wb.take_load_errors() == {2} and "a" not in wb.pool.peers
    # the host memory is the pool file's
    assert wb.host_bytes == 4 * 64
    assert np.frombuffer(wb.pool.own.mm, dtype=np.int8, count=64,
                         offset=wb.pool.offsets[0]).tolist() == tb[5].tolist()


def test_the_manager_publishes_its_stores_reads_peers_and_keeps_one_copy(tmp_path):
    """vLLM's CPU manager with the pool (``NodePoolManager``), two of them on one directory:
    a store is published when it completes, a peer's lookup hits it, a peer does not store
    it again, its load is not reference counted, an eviction or a failed store retracts."""
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    from anchorage.node_agent.offload.pool_manager import NodePoolManager

    def mgr(eid):
        return NodePoolManager(index(tmp_path, eid, n=2), num_chunks=2, cache_policy="lru")

    a, b = mgr("a"), mgr("b")
    ctx = ReqContext(req_id="r")
    out = a.prepare_store([b"k0", b"k1"], ctx)
    assert out.keys_to_store == [b"k0", b"k1"]
    assert b.lookup(b"k0", ctx) is LookupResult.MISS     # not readable before it completes
    a.complete_store([b"k0", b"k1"], ctx)
    assert b.lookup(b"k0", ctx) is LookupResult.HIT
    # one copy per node: b stores only what no engine holds
    assert b.prepare_store([b"k0", b"k2"], ctx).keys_to_store == [b"k2"]
    b.complete_store([b"k2"], ctx)
    assert b.pool_counts["deduplicated"] == 1
    spec = b.prepare_load([b"k2", b"k0"], ctx)
    assert spec.owners.tolist() == [-1, 0] and spec.peers == ("a",)
    assert spec.block_ids.tolist()[1] == a._policy.get(b"k0").chunk_id
    b.complete_load([b"k2", b"k0"], ctx)                  # b's own count back to 0
    assert b._policy.get(b"k2").ref_cnt == 0 and not b._from_peers
    # a's tier is full: storing k3 evicts its least recent chunk (k0), retracted at once
    a.touch([b"k1"], ctx)
    assert a.prepare_store([b"k3"], ctx).evicted_keys == [b"k0"]
    assert b.lookup(b"k0", ctx) is LookupResult.MISS
    # a store the worker reports failed is never published
    a.hold_back([a._policy.get(b"k3").chunk_id])
    a.complete_store([b"k3"], ctx)
    assert a.lookup(b"k3", ctx) is LookupResult.HIT and b.lookup(b"k3", ctx) is \
        LookupResult.MISS
    # a load prepared after the peer dropped the chunk carries an unreadable version
    spec = b.prepare_load([b"k1"], ctx)
    a.reset_cache()
    assert b.lookup(b"k1", ctx) is LookupResult.MISS
    assert int(spec.versions[0]) % 2 == 0          # seen readable; the worker re-checks it
    b.complete_load([b"k1"], ctx)
    a.shutdown()
    b.shutdown()
    assert os.listdir(tmp_path) == []


def test_the_node_has_one_capacity_and_its_oldest_chunks_go_first(tmp_path, monkeypatch):
    """The node-wide LRU (the simulator's ``node-lru``): an engine grows past its share
    while the node has room; the owner of the node's oldest chunk makes room, in its own
    order refreshed by a peer's read; a store into a full node evicts the storer's own; an
    evicted chunk's pages go back to the node."""
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    from anchorage.node_agent.offload import pool_manager
    from anchorage.node_agent.offload.pool_manager import NodePoolManager

    monkeypatch.setattr(pool_manager, "HEADROOM", 0.25)   # keep 1 of the node's 4 free
    clock = Clock()

    def mgr(eid):
        idx = PoolIndex(str(tmp_path), eid, "model-a", 8, share=2, refresh_s=0.0,
                        scan_s=0.0, clock=clock)
        return NodePoolManager(idx, num_chunks=8, cache_policy="lru")

    a = mgr("a")
    data = PoolData(str(tmp_path), "a", 0, [4096], 1, 8)   # a's worker: a page per chunk
    b = mgr("b")
    ctx = ReqContext(req_id="r")

    def store(m, keys):
        out = m.prepare_store(keys, ctx)
        for c in (m._policy.get(k).chunk_id for k in out.keys_to_store):
            if m is a:
                data.buffers[0][c].fill_(7)   # the worker writes the chunk
        m.complete_store(out.keys_to_store, ctx)
        clock.t += 1.0
        return out

    def resident():
        return os.stat(data.own.path).st_blocks

    # a holds 3 chunks with a share of 2: the node (4) has room
    assert store(a, [b"k0", b"k1", b"k2"]).evicted_keys == []
    assert a._used() == 3
    pages = resident()
    b.balance(force=True)
    a.balance(force=True)
    assert b.index.node() == (4, 3, float(a._tail()))
    # b stores one more: the node holds 4, one more than it keeps
    assert store(b, [b"k3"]).evicted_keys == []
    # b reads a's k0: a refreshes it (its order: k1, k2, k0)
    assert b.lookup(b"k0", ctx) is LookupResult.HIT
    assert b.prepare_load([b"k0"], ctx).peers == ("a",)
    b.complete_load([b"k0"], ctx)
    clock.t += 1.0
    b.balance(force=True)                  # b's tail (k3) is newer than a's (k1): b waits
    assert b._used() == 1
    a.balance(force=True)                  # a holds the node's oldest: its LRU goes, k1
    assert a._policy.get(b"k1") is None and a._policy.get(b"k0") is not None
    assert b.lookup(b"k1", ctx) is LookupResult.MISS and b.lookup(b"k0", ctx) is \
        LookupResult.HIT
    assert resident() < pages             # k1's page given back
    # the node is at what it keeps: b's store still fits (4), the next one evicts b's own
    b.balance(force=True)
    assert store(b, [b"k4"]).evicted_keys == []
    b.balance(force=True)
    assert store(b, [b"k5"]).evicted_keys == [b"k3"]
    a.shutdown()
    b.shutdown()
    data.close()


def test_the_snapshot_and_metrics_carry_the_node_pool_only_when_it_is_on():
    from anchorage.node_agent.metrics import host_tier_families
    from anchorage.node_agent.offload.tracker import HostTierTracker, parse_host_tier
    from anchorage.tiering.returns import SessionReturns

    def snap(pool):
        t = HostTierTracker(SessionReturns(), capacity_chunks=8, chunk_bytes=64,
                            node_pool=pool)
        t.failed({"load_failures": 2, "peer_stale": 1})
        return parse_host_tier(t.view(0.0, 1.0))

    on = snap(lambda: {"peers": 2, "peer_hits": 40, "deduplicated": 3})
    assert on["node_pool"] == {"peers": 2, "peer_hits": 40, "deduplicated": 3,
                               "stale_loads": 1}
    assert on["fallbacks"]["load_failed"] == 2
    fams = {f.name: f for f in host_tier_families("m", on)}
    got = {s.labels["kind"]: s.value
           for s in fams["anchorage_host_tier_node_pool_chunks"].samples}
    assert got == {"peer_hit": 40.0, "deduplicated": 3.0, "stale": 1.0}
    assert fams["anchorage_host_tier_node_pool_peers"].samples[0].value == 2.0
    off = snap(None)
    assert off["node_pool"] is None
    assert not any("node_pool" in f.name for f in host_tier_families("m", off))


def test_refreshes_take_a_backlog_in_bounded_steps_and_skip_unchanged_peers(tmp_path,
                                                                            monkeypatch):
    from anchorage.node_agent.offload import node_pool

    monkeypatch.setattr(node_pool, "REFRESH_MAX", 3)
    a = index(tmp_path, "a", n=8)
    for c in range(8):
        a.publish(c, b"k%d" % c)
    b = index(tmp_path, "b", n=8)
    sizes = []
    for _ in range(4):
        b.refresh(force=True)
        sizes.append(len(b.table))
    assert sizes == [3, 6, 8, 8]                  # at most 3 chunks per refresh
    seen = b.peers["a"].seen_epoch
    b.refresh(force=True)
    assert b.peers["a"].seen_epoch == seen == int(a.epoch[0])   # nothing changed: skipped
    a.retract(2)
    b.refresh(force=True)
    assert len(b.table) == 7 and b.find(b"k2") is None


def test_a_corrupt_peer_index_is_ignored_and_lookups_never_raise(tmp_path):
    (tmp_path / "z.idx").write_bytes(b"ANCHPOOL" + (5).to_bytes(4, "little") + b"{bad}")
    import fcntl

    fd = os.open(tmp_path / "z.idx", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)               # held: a live engine's file
    try:
        b = index(tmp_path, "b")
        assert "z" not in b.peers and b.find(b"k") is None

        def boom(*_a, **_k):
            raise OSError("the pool's directory went away")

        b.refresh = boom                         # any failure of the pool: a miss, logged
        assert b.find(b"k") is None and b.find(b"k") is None and b.counts["errors"] == 2
    finally:
        os.close(fd)
