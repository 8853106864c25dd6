"""``AnchorageOffloadingConnector``: vLLM 0.32's ``OffloadingConnector`` plus what
Anchorage's host tier needs from the requests, loaded out of tree by ``kv_connector:
AnchorageOffloadingConnector`` and ``kv_connector_module_path:
anchorage.node_agent.offload.connector``. Every transfer, store, load and event is vLLM's
own; this class only listens (public ``KVConnectorBase_V1`` methods, each calling vLLM's
first) and reports failed loads.

Specification
-------------
Scheduler side (``anchorage.node_agent.offload.tracker.HostTierTracker``):

- at start: the session predictions (``anchorage.tiering.returns.SessionReturns`` over the
  temporal controller, ``TemporalParams`` with the host budget ``cpu_bytes_to_use`` and the
  configured link) are bound to the host policy when it is ``AnchorageCachePolicy``;
- ``on_new_request``: the request's Anchorage metadata (``anchorage.node_agent.
  request_context.anchorage_args``, vLLM's ``session_id``) and prompt;
- ``get_num_new_matched_tokens`` / ``update_state_after_alloc``: the GPU hit and the host
  hit of each admitted request (hits, and reload outcomes);
- ``request_finished``: the turn end, with the readings the controller plans a tool stall
  over: ``PoolReading`` (the GPU pool's capacity and free blocks; cached free blocks
  unknown, counted as every free block; the queue unknown), ``SessionReading`` (the
  session's leading prompt chunks on GPU or in host memory; those host memory lacks; no
  recompute estimate) and the session's host keys (vLLM's ``make_offload_key`` of the
  chunks' last block hashes, per offloaded group);
- ``update_connector_output``: vLLM's transfer statistics (bytes each way) and the
  worker's failures (``AnchorageWorkerMetadata``); chunks whose store failed are demoted in
  the host policy and, with the node pool, never published to the node's other engines
  (held back before vLLM completes the store);
- the snapshot (``host_tier.json`` in the state directory) every ``snapshot_interval_s``,
  built in the step and written by a background thread (the step never waits on the file
  system).

Synchronous loads (``anchorage.tiering.loads``; ``sync_load_max_ms``, Anchorage on):
``get_num_new_matched_tokens`` turns vLLM's asynchronous host hit into a synchronous one
when it leaves at least one token to compute and ``sync_load`` accepts its copy (the
hit's blocks times the KV bytes per block, over ``link_gbs``; the step's earlier
synchronous copies counted): vLLM then schedules the
request in this step and tells the worker to load before the forward pass
(``SchedulerOutput.has_sync_kv_loads``). ``build_connector_meta`` sends the step's
synchronous load jobs to the worker (``AnchorageConnectorMetadata.sync_loads``; without
any, vLLM's metadata unchanged). The worker side waits for those jobs after submitting
them (``OffloadingWorker.wait``: a no-op for the CPU copy worker, whose copies are
synchronous; the transfer's event on CUDA) and keeps their requests out of
``finished_recving`` (vLLM's scheduler expects it only for requests waiting for remote
KV; a synchronously loaded request is already running). When a synchronous load fails
(the CPU copy worker only: vLLM's own worker has no failures), vLLM recomputes the request
from the failed block, but this step's forward pass has already computed its later blocks
over the bad prefix: the worker fails the request's store jobs of this step
(``TorchCopyWorker.fail_stores``), so those host copies are marked bad, never served. The
tracker counts synchronous loads (``transfers.sync_loads``).

Worker side: with the CPU transfer worker, ``get_block_ids_with_load_errors`` reports the
device blocks of failed loads (vLLM then recomputes them: ``kv_load_failure_policy`` must
be ``recompute``, checked at start), and the worker metadata carries its failures. vLLM
retries a request whose load failed from its prefix lookup; the connector then reports no
host hit for it (its failed load jobs, mapped to requests from the metadata this class
built), so it is recomputed instead of loading the same bad chunk again.

Disabled (``anchorage.enabled: false`` or the Anchorage plugin off): no tracker, no
binding; the connector is vLLM's ``OffloadingConnector`` (failed loads are still
reported, which vLLM's own worker never produces).

vLLM internals read here (isolated in ``manager_policy``): the CPU manager's policy
object, to bind the predictions.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.outputs import KVConnectorOutput

from anchorage.node_agent.offload.config import (
    HostTierConfigError,
    OffloadConfig,
    anchorage_enabled,
)
from anchorage.node_agent.offload.policy import AnchorageCachePolicy
from anchorage.node_agent.offload.pool_manager import NodePoolManager
from anchorage.node_agent.offload.tracker import HostTierTracker
from anchorage.node_agent.offload.worker import TorchCopyWorker
from anchorage.node_agent.request_context import anchorage_args, policy_clock
from anchorage.tiering.controller import PoolReading, SessionReading
from anchorage.tiering.host_tier import HostTierConfig
from anchorage.tiering.loads import sync_load
from anchorage.tiering.params import TemporalParams
from anchorage.tiering.returns import SessionReturns

log = logging.getLogger("anchorage.node_agent.offload")


def manager_policy(manager: Any) -> Any:
    """The host-tier policy object of vLLM's ``CPUOffloadingManager`` (private field
    ``_policy`` in vLLM 0.32); None when absent."""
    return getattr(manager, "_policy", None)


def policy_label(policy: Any) -> str:
    """``anchorage`` (bound), ``lru``, ``arc`` or the policy's class name."""
    if isinstance(policy, AnchorageCachePolicy):
        return policy.name
    cls = type(policy).__name__
    return {"LRUCachePolicy": "lru", "ARCCachePolicy": "arc"}.get(cls, cls)


def policy_occupancy(policy: Any) -> int:
    """Chunks a host policy holds (vLLM's LRU and Anchorage's: ``chunks``; ARC: T1 + T2)."""
    chunks = getattr(policy, "chunks", None)
    if chunks is not None:
        return len(chunks)
    return len(getattr(policy, "t1", ())) + len(getattr(policy, "t2", ()))


@dataclass
class AnchorageWorkerMetadata(OffloadingWorkerMetadata):
    """vLLM's worker metadata plus the transfer worker's failures of the step."""

    failures: dict[str, int] = field(default_factory=dict)
    failed_chunks: list[int] = field(default_factory=list)
    failed_loads: list[int] = field(default_factory=list)

    def aggregate(self, other):
        base = super().aggregate(other)
        fail = dict(self.failures)
        chunks, loads = list(self.failed_chunks), list(self.failed_loads)
        if isinstance(other, AnchorageWorkerMetadata):
            for k, v in other.failures.items():
                fail[k] = fail.get(k, 0) + v
            chunks += other.failed_chunks
            loads += other.failed_loads
        return AnchorageWorkerMetadata(completed_jobs=base.completed_jobs,
                                       transfer_stats=base.transfer_stats,
                                       failures=fail, failed_chunks=chunks,
                                       failed_loads=loads)


@dataclass
class AnchorageConnectorMetadata(OffloadingConnectorMetadata):
    """vLLM's connector metadata plus the step's synchronous load jobs."""

    sync_loads: frozenset[int] = frozenset()


def request_meta(request: Any) -> dict[str, Any]:
    a = anchorage_args(request)
    sid = getattr(request, "session_id", None)
    return {"session": sid if isinstance(sid, str) else None, "tool": a.get("tool_name"),
            "args": a.get("tool_args"), "warmup": a.get("warmup") in (True, 1),
            "agent": a.get("agent"), "tenant": a.get("tenant"),
            "cache_salt": getattr(request, "cache_salt", None)}


class AnchorageOffloadingConnector(OffloadingConnector):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config):
        ktc = vllm_config.kv_transfer_config
        self.anchorage = OffloadConfig.from_extra_config(ktc.kv_connector_extra_config)
        if ktc.kv_load_failure_policy != "recompute":
            raise HostTierConfigError(
                "kv_transfer_config.kv_load_failure_policy must be \"recompute\" for "
                f"AnchorageOffloadingConnector (a failed host copy is recomputed), got "
                f"{ktc.kv_load_failure_policy!r}")
        super().__init__(vllm_config, role, kv_cache_config)
        self.tracker: HostTierTracker | None = None
        self._gpu_pool: Any = None
        self._local: dict[str, int] = {}
        self._block_size = vllm_config.cache_config.block_size
        self._block_bytes = 0
        self._policy: Any = manager_policy(self.connector_scheduler.manager) if (
            self.connector_scheduler is not None) else None
        self._load_jobs: dict[int, str] = {}  # load job in flight -> request id
        self._no_host: set[str] = set()       # requests whose load failed: recomputed
        on = anchorage_enabled(self.anchorage)
        # synchronous loads: scheduler side, this step's requests and copy time; worker
        # side, the synchronous load jobs (-> request) whose completion vLLM must not see
        self._sync_max_s = self.anchorage.sync_load_max_ms / 1e3 if on else 0.0
        self._sync_reqs: set[str] = set()
        self._step_sync_s = 0.0
        self._sync_jobs: dict[int, str] = {}
        if role == KVConnectorRole.SCHEDULER and on:
            self._start_tracker(kv_cache_config)

    # -- scheduler side -------------------------------------------------------------------

    def _start_tracker(self, kv_cache_config) -> None:
        from anchorage.node_agent.vllm_compat import kv_block_bytes

        cfg = self.anchorage
        link = cfg.link_gbs * 1e9
        params = TemporalParams(host=HostTierConfig(capacity_bytes=cfg.cpu_bytes_to_use,
                                                    d2h_bytes_s=link, h2d_bytes_s=link))
        returns = SessionReturns(params)
        self._block_bytes = kv_block_bytes(kv_cache_config)
        pol = self._policy
        if isinstance(pol, AnchorageCachePolicy) and not pol.bind(returns, policy_clock):
            log.warning("anchorage: the host policy held chunks before it was bound; it "
                        "stays vLLM's LRU")
        name = policy_label(pol)
        chunks = getattr(pol, "cache_capacity", 0)
        bpc = self.connector_scheduler.config.blocks_per_chunk
        mgr = self.connector_scheduler.manager
        pool = None
        if isinstance(mgr, NodePoolManager):
            chunks = mgr.index.share   # its own capacity (its slots are the node pool's growth)

            def pool() -> dict[str, int]:
                return {"peers": len(mgr.index.peers), **mgr.pool_counts}
        self.tracker = HostTierTracker(
            returns, capacity_chunks=chunks, chunk_bytes=self._block_bytes * bpc,
            reload_ahead=cfg.reload_ahead, policy_name=str(name),
            occupancy=lambda: policy_occupancy(pol), node_pool=pool)
        returns.ctl.attach(max(1, kv_cache_config.num_blocks - 1))

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        self._gpu_pool = gpu_block_pool

    def on_new_request(self, request) -> None:
        super().on_new_request(request)
        if self.tracker is not None:
            self.tracker.arrived(request.request_id, request_meta(request),
                                 request.prompt_token_ids, policy_clock())

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        out = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if request.request_id in self._no_host and out[0]:
            out = (0, False)  # its load failed: vLLM retries the lookup; recompute instead
        elif (out[0] and out[1] and self._sync_max_s > 0 and self._block_bytes > 0
              and num_computed_tokens + out[0] < request.num_tokens):
            # (a hit of the whole prompt stays asynchronous: vLLM computes at least one
            # token in the step that schedules a request)
            blocks = -(-out[0] // self._block_size)
            copy_s = blocks * self._block_bytes / (self.anchorage.link_gbs * 1e9)
            if sync_load(copy_s, self._step_sync_s, self._sync_max_s):
                self._step_sync_s += copy_s
                self._sync_reqs.add(request.request_id)
                out = (out[0], False)
        if self.tracker is not None:
            self._local[request.request_id] = num_computed_tokens
        return out

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        sync = bool(num_external_tokens) and request.request_id in self._sync_reqs
        if sync:
            blocks = self._as_before_caching(blocks, self._local.get(request.request_id, 0),
                                             num_external_tokens)
        out = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if sync:
            self._complete_sync_load(request.request_id)
        if self.tracker is not None:
            local = self._local.pop(request.request_id, 0)
            self.tracker.allocated(request.request_id, local, num_external_tokens,
                                   self._block_size)
        return out

    def _as_before_caching(self, blocks, local: int, external: int):
        """The request's blocks with the loaded range uncached: vLLM's connector plans its
        load over the blocks after the local hit that vLLM has not cached yet, and a
        synchronous load's blocks are cached when they are allocated."""
        from anchorage.node_agent.vllm_compat import blocks_before_caching

        ranges = {}
        for g in self.connector_scheduler.config.kv_group_configs:
            tpb = g.tokens_per_block
            ranges[g.group_idx] = (-(-local // tpb), -(-(local + external) // tpb))
        return blocks_before_caching(blocks, ranges)

    def _complete_sync_load(self, rid: str) -> None:
        """The request's load job, just created, runs before this step's forward pass: vLLM's
        scheduler side completes it now (its own completion path, as if the workers had
        reported it), so the request's stores of this step are allowed (vLLM issues a
        store only when no load of the request is pending) and its host chunks are
        released; the host chunks are read before any store this step plans can reuse
        them (stores run from the next step on). The workers leave the job out of their
        completions (``build_connector_worker_meta``)."""
        from anchorage.node_agent.vllm_compat import offload_step_load_jobs

        cs = self.connector_scheduler
        jobs = [j for j, job in offload_step_load_jobs(cs).items() if job.req_id == rid]
        if jobs:
            n = cs.config.num_workers
            cs.update_connector_output(KVConnectorOutput(
                kv_connector_worker_meta=OffloadingWorkerMetadata(
                    completed_jobs={j: n for j in jobs})))

    def _readings(self, request):
        def read(sid):
            pool = self._gpu_pool
            if pool is None or self._block_bytes <= 0:
                return None
            keys, on_gpu, missing = self._session_chunks(request)
            if not keys:
                return None
            free = pool.get_num_free_blocks()
            reading = PoolReading(capacity_blocks=max(1, pool.num_gpu_blocks - 1),
                                  free_blocks=free, cached_free_blocks=free,
                                  block_bytes=self._block_bytes, waiting=None)
            session = SessionReading(gpu_blocks=len(keys), copy_blocks=missing,
                                     recompute_s=math.inf)
            return reading, session, keys
        return read

    def _session_chunks(self, request) -> tuple[list, int, int]:
        """The request's leading full prompt chunks on GPU or in host memory: (host keys,
        how many are on GPU, how many host memory lacks)."""
        cfg = self.connector_scheduler.config
        hashes = request.block_hashes
        pool, pol = self._gpu_pool, self._policy
        n_prompt = request.num_prompt_tokens
        keys, on_gpu, missing = [], 0, 0
        g0 = cfg.kv_group_configs[0]
        for i in range(n_prompt // g0.tokens_per_chunk):
            h = hashes[(i + 1) * g0.hashes_per_chunk - 1]
            ks = [make_offload_key(h, g.group_idx) for g in cfg.kv_group_configs]
            gpu = pool.get_cached_block(h, [g0.group_idx]) is not None
            host = pol is not None and all(pol.get(k) is not None for k in ks)
            if not (gpu or host):
                break
            keys.extend(ks)
            on_gpu += gpu
            missing += not host
        return keys, on_gpu, missing

    def request_finished(self, request, block_ids):
        out = super().request_finished(request, block_ids)
        self._finish(request)
        return out

    def request_finished_all_groups(self, request, block_ids):
        out = super().request_finished_all_groups(request, block_ids)
        self._finish(request)
        return out

    def _finish(self, request) -> None:
        self._no_host.discard(request.request_id)
        if self.tracker is None:
            return
        self._local.pop(request.request_id, None)
        self.tracker.finished(request.request_id, policy_clock(), self._readings(request))

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        sync = self._sync_reqs
        for job_id, job in meta.load_jobs.items():
            if job.req_id not in sync:  # a failed synchronous load: vLLM recomputes it
                self._load_jobs[job_id] = job.req_id
        if sync:
            jobs = frozenset(j for j, job in meta.load_jobs.items() if job.req_id in sync)
            if jobs:
                meta = AnchorageConnectorMetadata(
                    load_jobs=meta.load_jobs, store_jobs=meta.store_jobs,
                    jobs_to_flush=meta.jobs_to_flush, sync_loads=jobs)
                if self.tracker is not None:
                    self.tracker.sync_loads += len(jobs)
            sync.clear()
        self._step_sync_s = 0.0
        t = self.tracker
        if t is not None:
            t.maybe_write(lambda: self.anchorage.state_path,
                          self.anchorage.snapshot_interval_s, policy_clock())
        return meta

    def update_connector_output(self, connector_output) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, AnchorageWorkerMetadata) and meta.failed_chunks:
            mgr = self.connector_scheduler.manager if self.connector_scheduler else None
            if isinstance(mgr, NodePoolManager):  # before vLLM completes (publishes) them
                mgr.hold_back(meta.failed_chunks)
        super().update_connector_output(connector_output)
        if not isinstance(meta, OffloadingWorkerMetadata):
            return
        if isinstance(meta, AnchorageWorkerMetadata):
            for job_id in meta.failed_loads:
                rid = self._load_jobs.get(job_id)
                if rid is not None:
                    self._no_host.add(rid)
            if meta.failed_chunks and isinstance(self._policy, AnchorageCachePolicy):
                self._policy.demote(meta.failed_chunks)
        for job_id in meta.completed_jobs:
            self._load_jobs.pop(job_id, None)
        t = self.tracker
        if t is None:
            return
        ts = meta.transfer_stats
        t.transferred(ts.store.bytes, ts.load.bytes, len(ts.store.sizes), len(ts.load.sizes))
        if isinstance(meta, AnchorageWorkerMetadata) and meta.failures:
            t.failed(meta.failures)

    def shutdown(self) -> None:
        if self.tracker is not None:
            self.tracker.maybe_write(self.anchorage.state_path, 0.0, policy_clock(), True)
        super().shutdown()

    # -- worker side ----------------------------------------------------------------------

    def _copy_worker(self) -> TorchCopyWorker | None:
        w = self.connector_worker.worker if self.connector_worker is not None else None
        return w if isinstance(w, TorchCopyWorker) else None

    def start_load_kv(self, forward_context, **kwargs) -> None:
        super().start_load_kv(forward_context, **kwargs)
        meta = self._connector_metadata
        jobs = getattr(meta, "sync_loads", None)
        if jobs:  # the forward pass reads them: wait for the copies
            self.connector_worker.worker.wait(set(jobs))
            self._sync_jobs.update((j, meta.load_jobs[j].req_id) for j in jobs)
            w = self._copy_worker()
            bad = set() if w is None else {
                meta.load_jobs[j].req_id for j in jobs if w.load_failed(j)}
            if bad:  # this step computes their later blocks over a bad prefix
                w.fail_stores([j for j, job in meta.store_jobs.items() if job.req_id in bad])

    def get_finished(self, finished_req_ids: set[str]):
        sending, recving = super().get_finished(finished_req_ids)
        if self._sync_jobs and recving:  # (their jobs leave in build_connector_worker_meta)
            recving = set(recving).difference(self._sync_jobs.values())
        return sending, recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        w = self._copy_worker()
        return w.take_load_errors() if w is not None else set()

    def build_connector_worker_meta(self):
        meta = super().build_connector_worker_meta()
        if meta is not None and self._sync_jobs:  # completed by the scheduler side
            for j in self._sync_jobs.keys() & meta.completed_jobs.keys():
                del meta.completed_jobs[j]
                del self._sync_jobs[j]
        w = self._copy_worker()
        if w is None:
            return meta
        fails = {k: w.counts[k] - w.reported.get(k, 0)
                 for k in ("store_failures", "load_failures", "timeouts", "peer_stale")}
        fails = {k: v for k, v in fails.items() if v}
        chunks, loads = list(w.failed_chunks()), w.failed_loads()
        if not fails and not chunks and not loads:
            return meta
        for k in fails:
            w.reported[k] = w.counts[k]
        base = meta if meta is not None else OffloadingWorkerMetadata()
        return AnchorageWorkerMetadata(completed_jobs=base.completed_jobs,
                                       transfer_stats=base.transfer_stats,
                                       failures=fails, failed_chunks=chunks,
                                       failed_loads=loads)
