"""Everything the plugin knows about vLLM's internals, for one vLLM version (0.32.x).

A new vLLM version is this file plus the fidelity tests (``tests/pool/test_vllm_fidelity.py``,
``tests/node_agent/test_block_pool_patch.py``, ``tests/node_agent/test_vllm_compat.py`` and
vLLM's own KV-cache tests vendored at that version, ``tests/node_agent/vllm_upstream/``).
No other ``node_agent`` module reads a private field of a vLLM object or patches one.

1. ``SUPPORTED_PREFIX`` and ``HOOKS``: one table of every vLLM callable the plugin replaces
   (``replacement``: ``"module:function"``) or relies on unchanged (``replacement`` None),
   by install group (``"pool"``: the eviction patch, ``node_agent.vllm_hooks``;
   ``"scheduler"``: the prefix-aware admission, ``node_agent.scheduler``; ``"engine"``: the
   config checks of an idle engine core, ``node_agent.idle_reload``). The table drives
   the version check (``unsupported_reason``), ``install`` and ``uninstall``; ``ORIGINALS``
   holds the replaced methods by key (``"BlockPool.touch"``). ``UNHOOKED`` names every other
   method of ``BlockPool`` and ``KVCacheManager`` with why it needs no hook (a test checks
   that the two lists cover the installed classes, so a new method cannot go unnoticed).
2. Accessors for vLLM's private structures: the engine chain (``LLM`` -> engine core ->
   scheduler -> ``KVCacheManager`` -> ``BlockPool``), the pool's free queue (a linked list
   with sentinels), its prefix-cache maps, the KV cache config, the scheduler's queue and
   the shape the prefix-aware scheduler needs; for the host tier's synchronous loads, the
   offloading connector's load jobs of the step being scheduled
   (``offload_step_load_jobs``) and a request's blocks as the connector expects them
   before vLLM caches them (``blocks_before_caching``).
3. Slots: the attributes Anchorage keeps on vLLM's ``BlockPool`` objects (its policy
   driver, config reloader and the scheduler's waiting-demand callback).
4. ``ensure_cpu_attention_isa``: vLLM 0.32's CPU attention kernel (ISA ``amx``) runs AMX
   tiles without asking the kernel for AMX state; torch asks when oneDNN first runs an
   AMX matmul, which a prefill does. An engine whose first forward pass is a one-token
   query over a prefix loaded from host memory (a node-pool hit: another engine computed
   it) dies with SIGILL. The host tier's transfer worker asks once at start.

Not here: the data fields of the objects vLLM hands to the hooked methods, read where they
arrive: a ``KVCacheBlock``'s ``block_id``, ``block_hash``, ``ref_cnt``, ``is_null``,
``block_hash_num_tokens`` and ``pool`` (the hooks and the driver, per block on the hot
path), and a ``Request``'s fields (``node_agent.request_context``, the scheduler's order).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SUPPORTED_PREFIX = "0.32."

_BP = "vllm.v1.core.block_pool:BlockPool"
_KVM = "vllm.v1.core.kv_cache_manager:KVCacheManager"
_Q = "vllm.v1.core.kv_cache_utils:FreeKVCacheBlockQueue"
_H = "anchorage.node_agent.vllm_hooks:"
_S = "anchorage.node_agent.scheduler:"
_ECP = "vllm.v1.engine.core:EngineCoreProc"
_I = "anchorage.node_agent.idle_reload:"


@dataclass(frozen=True)
class Hook:
    """One vLLM callable: ``owner`` (``"module:Class"`` or ``"module"``) . ``name``;
    ``replacement`` (``"module:function"``) or None when the plugin calls it as it is."""

    owner: str
    name: str
    replacement: str | None
    group: str

    @property
    def key(self) -> str:
        return f"{self.owner.rpartition(':')[2] or self.owner}.{self.name}"


HOOKS: tuple[Hook, ...] = (
    # the block pool: the one decision (which cached free blocks go) and what the policy
    # hears so that its view of the pool matches vLLM's (node_agent.vllm_hooks)
    Hook(_BP, "__init__", _H + "init", "pool"),
    Hook(_BP, "get_new_blocks", _H + "get_new_blocks", "pool"),
    Hook(_BP, "touch", _H + "touch", "pool"),
    Hook(_BP, "free_blocks", _H + "free_blocks", "pool"),
    Hook(_BP, "unpin_blocks", _H + "unpin_blocks", "pool"),
    Hook(_BP, "cache_full_blocks", _H + "cache_full_blocks", "pool"),
    Hook(_BP, "cache_partial_block", _H + "cache_partial_block", "pool"),
    Hook(_BP, "move_block_hashes", _H + "move_block_hashes", "pool"),
    Hook(_BP, "_maybe_evict_cached_block", _H + "maybe_evict_cached_block", "pool"),
    Hook(_BP, "reset_prefix_cache", _H + "reset_prefix_cache", "pool"),
    Hook(_KVM, "get_computed_blocks", _H + "get_computed_blocks", "pool"),
    Hook(_KVM, "get_computed_blocks_for_connector", _H + "get_computed_blocks_for_connector",
         "pool"),
    Hook(_KVM, "allocate_slots", _H + "allocate_slots", "pool"),
    Hook(_KVM, "free", _H + "free", "pool"),
    Hook(_KVM, "pop_blocks_for_free", _H + "pop_blocks_for_free", "pool"),
    Hook(_Q, "remove", None, "pool"),
    Hook(_Q, "prepend_n", None, "pool"),
    Hook(_Q, "popleft_n", None, "pool"),
    # prefix-aware admission (node_agent.scheduler): vLLM's own setting picks the class
    Hook("vllm.config.scheduler:SchedulerConfig", "get_scheduler_cls",
         _S + "_get_scheduler_cls", "scheduler"),
    Hook("vllm.v1.core.sched.scheduler:Scheduler", "schedule", None, "scheduler"),
    Hook("vllm.v1.core.sched.async_scheduler:AsyncScheduler", "schedule", None, "scheduler"),
    Hook("vllm.v1.core.kv_cache_utils", "make_block_hash_with_group_id", None, "scheduler"),
    Hook("vllm.v1.core.sched.request_queue:FCFSRequestQueue", "extend", None, "scheduler"),
    # an idle engine core checks ANCHORAGE_CONFIG too (node_agent.idle_reload)
    Hook(_ECP, "_process_input_queue", _I + "process_input_queue", "engine"),
    Hook(_ECP, "_handle_client_request", _I + "handle_client_request", "engine"),
    Hook(_ECP, "is_running", None, "engine"),
)

#: Methods of ``BlockPool`` / ``KVCacheManager`` (0.32) left unhooked, and why.
UNHOOKED: dict[str, str] = {
    **dict.fromkeys((
        "BlockPool.get_cached_block", "BlockPool._get_partial_block_hash",
        "BlockPool._get_partial_block_parent_hash_and_start", "BlockPool.is_block_writable",
        "BlockPool.get_num_free_blocks", "BlockPool.get_usage", "KVCacheManager.usage",
        "KVCacheManager.prefix_cache_lookup_enabled", "KVCacheManager.get_blocks",
        "KVCacheManager.get_num_common_prefix_blocks", "KVCacheManager.get_block_ids",
        "KVCacheManager.get_block_ids_for_computed_tokens",
        "KVCacheManager.estimate_cached_tokens", "KVCacheManager.create_kv_cache_blocks",
        "KVCacheManager.truncate_computed_blocks"), "reads or wraps; changes no block"),
    **dict.fromkeys((
        "BlockPool._build_block_stored_event", "BlockPool.emit_cached_block_events",
        "BlockPool._emit_block_removed_events", "BlockPool.take_events",
        "KVCacheManager.take_events", "KVCacheManager.make_prefix_cache_stats",
        "KVCacheManager.record_prefix_cache_stats"), "KV events or statistics only"),
    **dict.fromkeys((
        "KVCacheManager.take_new_block_ids", "KVCacheManager.record_blocks_for_zeroing",
        "KVCacheManager.take_boundary_state_offloads",
        "KVCacheManager.finalize_partial_tail_offloads", "KVCacheManager.new_step_starts"),
        "worker, connector or coordinator bookkeeping; no pool state"),
    "BlockPool._remove_cached_block_hashes": "private; its callers are hooked and report "
        "the keys a block lost",
    "BlockPool._insert_block_hash": "private; its callers are hooked and report the key",
    "BlockPool._notify_reuse": "reuse watchers of unpinned blocks; no cache state",
    "BlockPool.evict_blocks": "evicts through _maybe_evict_cached_block (hooked)",
    "KVCacheManager.__init__": "builds the pool through BlockPool.__init__ (hooked)",
    "KVCacheManager.remove_skipped_blocks": "frees through BlockPool.free_blocks (hooked)",
    "KVCacheManager.evict_blocks": "through BlockPool.evict_blocks",
    "KVCacheManager.reset_prefix_cache": "through BlockPool.reset_prefix_cache (hooked)",
    "KVCacheManager.cache_blocks": "through BlockPool.cache_full_blocks / "
        "cache_partial_block (hooked)",
    "KVCacheManager.take_kv_cache_block_copies": "copy commands; the keys moved in "
        "BlockPool.move_block_hashes (hooked)",
}

ORIGINALS: dict[str, Callable[..., Any]] = {}  # hook key -> vLLM's method, while installed
_ABSENT: dict[str, bool] = {}  # hook key -> the class inherited the method (not its own)


def _resolve(path: str) -> Any:
    mod, _, attr = path.partition(":")
    obj = importlib.import_module(mod)
    return getattr(obj, attr) if attr else obj


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "?"))


def unsupported_reason(group: str) -> str | None:
    """Why this vLLM cannot take the ``group`` hooks (None when it can). Never raises."""
    try:
        version = vllm_version()
    except Exception as exc:  # noqa: BLE001 - any import failure means "stay stock"
        return f"vLLM cannot be imported ({exc.__class__.__name__}: {exc})"
    if not version.startswith(SUPPORTED_PREFIX):
        return f"vLLM {version} is not a supported version ({SUPPORTED_PREFIX}x)"
    for h in HOOKS:
        if h.group != group:
            continue
        try:
            owner = _resolve(h.owner)
        except Exception as exc:  # noqa: BLE001
            return f"vLLM {version}: {h.owner} cannot be imported ({exc.__class__.__name__})"
        if not callable(getattr(owner, h.name, None)):
            return f"vLLM {version}: {h.key} is missing"
    return None


def installed(group: str) -> bool:
    return any(h.key in ORIGINALS for h in HOOKS if h.group == group and h.replacement)


def install(group: str) -> None:
    """Replace the ``group`` methods by their replacements (idempotent)."""
    for h in HOOKS:
        if h.group != group or h.replacement is None or h.key in ORIGINALS:
            continue
        cls = _resolve(h.owner)
        new = _resolve(h.replacement)
        _ABSENT[h.key] = h.name not in vars(cls)
        ORIGINALS[h.key] = getattr(cls, h.name)
        setattr(cls, h.name, new)


def uninstall(group: str) -> None:
    """Give vLLM its own ``group`` methods back."""
    for h in HOOKS:
        if h.group != group or h.key not in ORIGINALS:
            continue
        cls = _resolve(h.owner)
        fn = ORIGINALS.pop(h.key)
        if _ABSENT.pop(h.key, False):
            delattr(cls, h.name)
        else:
            setattr(cls, h.name, fn)


# -- the engine chain -----------------------------------------------------------------------


def engine_scheduler(llm: Any) -> Any:
    """The scheduler of an in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def manager_pool(manager: Any) -> Any:
    """A ``KVCacheManager``'s ``BlockPool``."""
    return manager.block_pool


def engine_pool(llm: Any) -> Any:
    return manager_pool(engine_scheduler(llm).kv_cache_manager)


def kv_cache_config(manager: Any) -> Any:
    return manager.kv_cache_config


def kv_block_bytes(config: Any) -> int:
    """Bytes of one KV block over all layers, from vLLM's ``KVCacheConfig``: the backing
    tensors' bytes over the block count; without tensors, one attention group's page size
    times its layers. 0 when unknown (several groups without tensors, a Mamba or other
    state group, a shape this code does not read). Never raises."""
    try:
        n = int(getattr(config, "num_blocks", 0) or 0)
        tensors = getattr(config, "kv_cache_tensors", None) or ()
        total = sum(int(getattr(t, "size", 0) or 0) for t in tensors)
        if n > 0 and total > 0:
            return total // n
        groups = list(getattr(config, "kv_cache_groups", None) or ())
        if len(groups) != 1 or getattr(config, "has_mamba_layers", False):
            return 0
        g = groups[0]
        if "mamba" in type(g.kv_cache_spec).__name__.lower():
            return 0
        return max(0, int(g.kv_cache_spec.page_size_bytes) * len(g.layer_names))
    except Exception:  # noqa: BLE001 - a config this version's code cannot read: unknown
        return 0


# -- the block pool ---------------------------------------------------------------------------


def pool_blocks(pool: Any) -> list:
    """All ``KVCacheBlock`` s of the pool, by block id (block 0 is the null block)."""
    return pool.blocks


def usable_blocks(pool: Any) -> int:
    return pool.num_gpu_blocks - 1  # block 0 is vLLM's null block


def hash_block_size(pool: Any) -> int:
    return pool.hash_block_size


def caching_enabled(pool: Any) -> bool:
    return bool(pool.enable_caching)


def num_free_blocks(pool: Any) -> int:
    return pool.free_block_queue.num_free_blocks


def cached_lookup(pool: Any) -> Callable[[Any], Any]:
    """``key -> cached block or None`` over the prefix-cache map as it is now (re-read after
    ``reset_prefix_cache``, which replaces the map)."""
    return pool.cached_block_hash_to_block.get_one_block


def num_cached_keys(pool: Any) -> int:
    return len(pool.cached_block_hash_to_block)


def is_free(block: Any) -> bool:
    """``block`` is in the pool's free queue (reference count 0, not the null block)."""
    return block.ref_cnt == 0 and not block.is_null and block.prev_free_block is not None


def iter_free_blocks(pool: Any) -> Iterator[Any]:
    """The free queue, head (next to go) first."""
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    blk = q.fake_free_list_head.next_free_block
    while blk is not tail:
        yield blk
        blk = blk.next_free_block


def cached_free_block_ids(pool: Any) -> list[int]:
    """The free blocks that hold a cached block, in free-queue order (oldest first)."""
    return [b.block_id for b in iter_free_blocks(pool) if b.block_hash is not None]


def uncached_head(pool: Any, n: int) -> list:
    """Up to ``n`` free blocks at the head of the queue that hold no cached block (vLLM
    prepends freed uncached blocks there: ``get_new_blocks`` takes them first)."""
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    extra = pool.cached_block_hashes_by_block
    out = []
    blk = q.fake_free_list_head.next_free_block
    while (len(out) < n and blk is not tail and blk.block_hash is None
           and blk.block_id not in extra):
        out.append(blk)
        blk = blk.next_free_block
    return out


class InvalidVictim(ValueError):
    """A policy named a block that is not a free block of the pool (or one twice)."""


def free_blocks_named(pool: Any, ids: list) -> list:
    """The blocks of ``ids``, each a free block of ``pool`` named once; else
    ``InvalidVictim`` naming the first that is not."""
    blocks = pool.blocks
    n = len(blocks)
    out = []
    seen: set[int] = set()
    for b in ids:
        if type(b) is not int or not 0 < b < n or b in seen:
            raise InvalidVictim(f"victim {b!r}")
        vb = blocks[b]
        if vb.ref_cnt != 0 or vb.is_null or vb.prev_free_block is None:
            raise InvalidVictim(f"victim {b} is not a free block")
        seen.add(b)
        out.append(vb)
    return out


def move_to_head(pool: Any, blocks: list) -> None:
    """Put ``blocks`` (free) at the head of the free queue, in this order."""
    q = pool.free_block_queue
    for b in blocks:
        q.remove(b)
    q.prepend_n(blocks)


def cached_after_head(pool: Any, skip: int, n: int) -> list[int]:
    """Ids of the cached blocks among the ``n`` free blocks after the first ``skip``: the
    ones ``get_new_blocks`` takes in stock order after the blocks put at the head."""
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    blk = q.fake_free_list_head.next_free_block
    for _ in range(skip):
        blk = blk.next_free_block
    out = []
    for _ in range(n):
        if blk is tail:
            break
        if blk.block_hash is not None:
            out.append(blk.block_id)
        blk = blk.next_free_block
    return out


def group_suffix(group_id: int) -> bytes:
    """``make_block_hash_with_group_id(h, g) == h + group_suffix(g)``: a block hash is
    keyed in the prefix cache with its KV-cache group id appended (4 bytes, big endian)."""
    return group_id.to_bytes(4, "big")


def engine_core_pools(core: Any) -> list:
    """The ``BlockPool`` of an engine core's scheduler (a list: none without one)."""
    manager = getattr(getattr(core, "scheduler", None), "kv_cache_manager", None)
    pool = getattr(manager, "block_pool", None)
    return [] if pool is None else [pool]


def engine_core_queue(core: Any) -> Any:
    """An ``EngineCoreProc``'s input queue (what its busy loop blocks on when idle)."""
    return core.input_queue


def engine_core_running(core: Any) -> bool:
    return bool(core.is_running())


def engine_wakeup_type() -> Any:
    """The request type vLLM's busy loop takes off its input queue and ignores."""
    from vllm.v1.engine import EngineCoreRequestType

    return EngineCoreRequestType.WAKEUP


# -- the scheduler ----------------------------------------------------------------------------


def waiting_queue(scheduler: Any) -> Any:
    return scheduler.waiting


def scheduler_pool(scheduler: Any) -> Any:
    return manager_pool(scheduler.kv_cache_manager)


def prefix_aware_unsupported(scheduler: Any) -> str | None:
    """Why ``scheduler`` cannot be reordered by prefix (None when it can): FCFS policy,
    vLLM's FCFS deque, prefix caching on, one KV-cache group, the pool's prefix map."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, SchedulingPolicy

    if getattr(scheduler, "policy", None) is not SchedulingPolicy.FCFS:
        return f"scheduling policy {getattr(scheduler, 'policy', None)!r} is not FCFS"
    if type(getattr(scheduler, "waiting", None)) is not FCFSRequestQueue:
        return "the waiting queue is not vLLM's FCFS deque"
    kvm = getattr(scheduler, "kv_cache_manager", None)
    if kvm is None or not getattr(kvm, "enable_caching", False):
        return "prefix caching is off"
    groups = getattr(getattr(scheduler, "kv_cache_config", None), "kv_cache_groups", None)
    if groups is None or len(groups) != 1:
        return f"{len(groups) if groups is not None else 'unknown'} KV-cache groups (1 supported)"
    pool = getattr(kvm, "block_pool", None)
    if pool is None or not callable(getattr(getattr(pool, "cached_block_hash_to_block",
                                                    None), "get_one_block", None)):
        return "BlockPool.cached_block_hash_to_block.get_one_block is missing"
    if not isinstance(getattr(pool, "hash_block_size", None), int):
        return "BlockPool.hash_block_size is missing"
    return None


def is_fresh_waiting(request: Any) -> bool:
    """A waiting request stock vLLM has no reason to resume first (not preempted, nothing
    computed, not blocked on remote KV or structured output)."""
    from vllm.v1.request import RequestStatus

    return request.status is RequestStatus.WAITING and not request.num_computed_tokens


# -- the offloading connector ---------------------------------------------------------------


class _Uncached:
    """A device block as vLLM's offloading connector sees it before vLLM caches it."""

    __slots__ = ("block_hash", "block_id", "is_null")

    def __init__(self, block: Any):
        self.block_id = block.block_id
        self.is_null = block.is_null
        self.block_hash = None


def blocks_before_caching(blocks: Any, ranges: dict[int, tuple[int, int]]) -> Any:
    """``KVCacheBlocks`` with the blocks ``ranges[group] = (first, end)`` shown uncached.
    vLLM's ``OffloadingConnectorScheduler.update_state_after_alloc`` loads into the
    request's uncached blocks after its local hit: what an asynchronous load's blocks are
    (``allocate_slots(delay_cache_blocks=True)``). A synchronous load's blocks are cached
    at allocation, so the connector is shown them as they were before."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks

    groups = []
    for g, blks in enumerate(blocks.blocks):
        lo, hi = ranges.get(g, (0, 0))
        if hi > lo:
            blks = list(blks)
            blks[lo:hi] = [b if b.is_null else _Uncached(b) for b in blks[lo:hi]]
        groups.append(blks)
    return KVCacheBlocks(tuple(groups))


def offload_step_load_jobs(connector_scheduler: Any) -> dict:
    """The load jobs ``OffloadingConnectorScheduler`` has created in the step being
    scheduled (job id -> ``TransferJob``; sent to the workers by ``build_connector_meta``)."""
    return connector_scheduler._current_batch_load_jobs


# -- Anchorage's slots on vLLM objects --------------------------------------------------------


def driver(pool: Any) -> Any:
    """The ``PolicyDriver`` attached to ``pool`` (None: stock eviction)."""
    return getattr(pool, "_anchorage_driver", None)


def set_driver(pool: Any, driver: Any) -> None:
    pool._anchorage_driver = driver


def reloader(pool: Any) -> Any:
    """The pool's ``ANCHORAGE_CONFIG`` reloader (None without one)."""
    return getattr(pool, "_anchorage_reloader", None)


def set_reloader(pool: Any, reloader: Any) -> None:
    pool._anchorage_reloader = reloader


def waiting_demand_source(pool: Any) -> Callable[[], Any] | None:
    """The prefix-aware scheduler's view of its queue for this pool (None: not shown)."""
    return getattr(pool, "_anchorage_waiting_demand", None)


def set_waiting_demand_source(pool: Any, fn: Callable[[], Any]) -> None:
    pool._anchorage_waiting_demand = fn


def ensure_cpu_attention_isa() -> bool:
    """Ask the kernel for AMX state for this process (module docstring, 4), as torch does
    before its own AMX matmuls; idempotent, False where there is no AMX (nothing to do)."""
    import torch

    init = getattr(torch.cpu, "_init_amx", None)
    try:
        return bool(init()) if init is not None else False
    except Exception:  # noqa: BLE001 - no AMX: the kernel then never uses it
        return False
