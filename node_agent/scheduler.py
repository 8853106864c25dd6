"""Prefix-aware admission in vLLM 0.32 (CacheWise section 5.1): a ``Scheduler`` subclass.

``ANCHORAGE_SCHEDULER=prefix-aware`` (unset, empty, ``off`` or ``fcfs``: stock) makes the
engine core build ``PrefixAwareScheduler`` (or ``PrefixAwareAsyncScheduler`` when vLLM
chose async scheduling) through vLLM's own ``SchedulerConfig.scheduler_cls`` setting: the
plugin fills that setting, when it is empty, at the moment vLLM resolves it
(``SchedulerConfig.get_scheduler_cls``, in the engine core). Either class may also be
named directly: ``--scheduler-cls anchorage.node_agent.scheduler.PrefixAwareScheduler``.
A ``--scheduler-cls`` the operator set explicitly wins (one warning).

Behaviour: before each ``schedule()`` step, the waiting queue is reordered by
``anchorage.policies.admission.admission_order``: fewest new (uncached) blocks first,
``a_i = ceil(num_tokens_i / block_size) - (leading prompt blocks in vLLM's prefix
cache)``, aged by ``ANCHORAGE_ADMISSION_AGING_S`` seconds per block (default 0.05; the
aging bound is stated there), with the deployment's TTFT target
``ANCHORAGE_ADMISSION_TTFT_TARGET_S`` (default 2; ``0`` or ``off``: none): a request that has
waited ``ANCHORAGE_ADMISSION_URGENT_FRAC`` (0.5) of it goes first, in arrival order, and one
that missed it waits behind the rest until it has waited ``ANCHORAGE_ADMISSION_LATE_AFTER``
(4) times the target (``AdmissionParams``). With ``ANCHORAGE_TIERING=spatial`` a request's
arrival is moved earlier by 1 s x its agent's criticality (``node_agent.tiering.admission_arrival``:
a critical agent overtakes requests up to 1 s older). Then vLLM's own ``schedule()`` runs
unchanged: it takes waiting requests from the head as budget allows, so this changes the
admission order and nothing else. Requests that stock vLLM must resume first (preempted,
already computed tokens, or in a blocked status such as waiting for remote KV) keep their
order at the head; only the first ``ANCHORAGE_ADMISSION_WINDOW`` (default 128) fresh
requests are reordered, the rest stay FCFS behind them.

Cost per step: O(n log n) for the n reordered requests plus the prefix lookups, which are
incremental: a request's last hit count ``k`` is re-validated by its first, middle and last
blocks (three dictionary lookups), then extended; a full walk only when one of those left
the cache. (An eviction elsewhere inside the hit goes unseen until then: the order is a
heuristic; vLLM's own prefix lookup at admission stays exact.)

Stays stock (one warning, the class behaves exactly as vLLM's) when vLLM is not 0.32.x or
an internal shape is unexpected: priority scheduling (``--scheduling-policy priority``),
no prefix caching, several KV-cache groups, a waiting queue that is not vLLM's FCFS deque,
a missing attribute. Any exception while reordering: the queue is left as it was for
that step, counted (``errors``), one warning; after 100 errors reordering stops.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from anchorage.node_agent import vllm_compat as vc

log = logging.getLogger("anchorage.node_agent")

ENV_SCHEDULER = "ANCHORAGE_SCHEDULER"
ENV_AGING = "ANCHORAGE_ADMISSION_AGING_S"
ENV_WINDOW = "ANCHORAGE_ADMISSION_WINDOW"
ENV_TTFT = "ANCHORAGE_ADMISSION_TTFT_TARGET_S"
ENV_URGENT = "ANCHORAGE_ADMISSION_URGENT_FRAC"
ENV_LATE = "ANCHORAGE_ADMISSION_LATE_AFTER"
DEFAULT_TTFT_TARGET_S = 2.0
PREFIX_AWARE = "prefix-aware"
STOCK = ("", "off", "none", "stock", "fcfs")
SYNC_PATH = f"{__name__}.PrefixAwareScheduler"
ASYNC_PATH = f"{__name__}.PrefixAwareAsyncScheduler"
MAX_ERRORS = 100

_warned: set[str] = set()


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


def configured() -> str | None:
    """``ANCHORAGE_SCHEDULER`` normalised; None for stock."""
    v = os.environ.get(ENV_SCHEDULER, "").strip().lower()
    return None if v in STOCK else v


def _env_float(name: str, default: float, positive: bool = True) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
        if positive and not v > 0:
            raise ValueError
        return v
    except ValueError:
        _warn_once(name, "anchorage: %s=%r is not a positive number; using %g", name, raw,
                   default)
        return default


def admission_params() -> Any:
    """``AdmissionParams`` from the environment (module docstring); a value that is not
    valid: one warning naming it, and the defaults."""
    from anchorage.policies.admission import AdmissionParams

    d = AdmissionParams(ttft_target_s=DEFAULT_TTFT_TARGET_S)
    raw = os.environ.get(ENV_TTFT, "").strip().lower()
    target: float | None = d.ttft_target_s
    if raw in ("0", "off", "none"):
        target = None
    elif raw:
        target = _env_float(ENV_TTFT, DEFAULT_TTFT_TARGET_S)
    urgent = _env_float(ENV_URGENT, d.urgent_frac, positive=False)
    late = _env_float(ENV_LATE, d.late_after)
    kw = dict(aging_s_per_block=_env_float(ENV_AGING, d.aging_s_per_block),
              ttft_target_s=target, urgent_frac=urgent, late_after=late)
    try:
        return AdmissionParams(**kw)
    except ValueError as exc:
        _warn_once(f"admission:{exc}", "anchorage: %s; using the default admission "
                   "parameters", exc)
        return d


def unsupported_reason() -> str | None:
    """Why this vLLM cannot take the prefix-aware scheduler (None when it can)."""
    return vc.unsupported_reason("scheduler")


def register() -> bool:
    """Called by the plugin's entry point: True when new engines get the prefix-aware
    scheduler (idempotent)."""
    mode = configured()
    if mode is None:
        return False
    if mode != PREFIX_AWARE:
        _warn_once(f"mode:{mode}", "anchorage: %s=%r is not a scheduler (known: %s); vLLM's "
                   "stock scheduler", ENV_SCHEDULER, mode, PREFIX_AWARE)
        return False
    reason = unsupported_reason()
    if reason is not None:
        _warn_once("unsupported", "anchorage: %s; vLLM's stock scheduler", reason)
        return False
    vc.install("scheduler")
    return True


def _get_scheduler_cls(self: Any) -> Any:
    """``SchedulerConfig.get_scheduler_cls``: fills the empty ``scheduler_cls`` setting with
    the prefix-aware class while ``ANCHORAGE_SCHEDULER=prefix-aware``."""
    if configured() == PREFIX_AWARE:
        if self.scheduler_cls is None:
            self.scheduler_cls = ASYNC_PATH if self.async_scheduling else SYNC_PATH
        elif self.scheduler_cls not in (SYNC_PATH, ASYNC_PATH):
            _warn_once("explicit", "anchorage: %s=%s ignored: the engine's scheduler_cls is "
                       "set to %s", ENV_SCHEDULER, PREFIX_AWARE, self.scheduler_cls)
    return vc.ORIGINALS["SchedulerConfig.get_scheduler_cls"](self)


# -- the adapter (vLLM Request <-> admission_order) ----------------------------------------


def _arrival_time(request: Any) -> float:
    return request.arrival_time


class PrefixAwareMixin:
    """Reorders ``self.waiting`` before vLLM's ``schedule()``. Mixed into vLLM's
    ``Scheduler`` / ``AsyncScheduler`` (see ``__getattr__`` below)."""

    _anchorage_arrival = staticmethod(_arrival_time)  # ANCHORAGE_TIERING: node_agent/tiering

    def _anchorage_init(self) -> None:
        self.anchorage_enabled = False
        self.anchorage_errors = 0
        self.anchorage_reorders = 0  # steps whose admission order differed from FCFS
        self.anchorage_admission = admission_params()
        self.anchorage_window = int(_env_float(ENV_WINDOW, 128))
        self._anchorage_hits: dict[str, int] = {}
        reason = self._anchorage_unsupported()
        if reason is not None:
            _warn_once(f"shape:{reason}", "anchorage: prefix-aware admission off (%s); "
                       "vLLM's stock scheduling order", reason)
            return
        from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

        pool = vc.scheduler_pool(self)
        self._anchorage_pool = pool
        self._anchorage_lookup = vc.cached_lookup(pool)
        self._anchorage_key = make_block_hash_with_group_id
        self._anchorage_bs = int(vc.hash_block_size(pool))
        from anchorage.node_agent.tiering import admission_arrival  # ANCHORAGE_TIERING

        self._anchorage_arrival = admission_arrival(pool) or _arrival_time
        vc.set_waiting_demand_source(pool, self._anchorage_waiting_demand)  # node_agent/temporal
        self.anchorage_enabled = True
        adm = self.anchorage_admission
        log.info("anchorage: prefix-aware admission (aging %g s per block, window %d, "
                 "TTFT target %s)", adm.aging_s_per_block, self.anchorage_window,
                 "none" if adm.ttft_target_s is None else f"{adm.ttft_target_s:g} s")

    def _anchorage_unsupported(self) -> str | None:
        return vc.prefix_aware_unsupported(self)

    def _anchorage_new_blocks(self, request: Any) -> int:
        hashes = request.block_hashes
        n = len(hashes)
        lookup, key = self._anchorage_lookup, self._anchorage_key
        if getattr(request, "skip_reading_prefix_cache", False):
            return -(-request.num_tokens // self._anchorage_bs)  # vLLM will not read the cache
        k = self._anchorage_hits.get(request.request_id, 0)
        if k > n or (k > 0 and (lookup(key(hashes[k - 1], 0)) is None
                                or lookup(key(hashes[k // 2], 0)) is None
                                or lookup(key(hashes[0], 0)) is None)):
            k = 0  # a block of the known hit left the cache: walk again
        while k < n and lookup(key(hashes[k], 0)) is not None:
            k += 1
        self._anchorage_hits[request.request_id] = k
        bs = self._anchorage_bs
        return -(-request.num_tokens // bs) - k

    def _anchorage_waiting_demand(self, k: int = 32) -> list[tuple[int, int]]:
        """(new blocks, tokens) of the first ``k`` waiting requests in queue order: the
        temporal tiering gate's view of the queue (``PoolView.waiting_demand``)."""
        self._anchorage_lookup = vc.cached_lookup(self._anchorage_pool)
        return [(max(0, self._anchorage_new_blocks(r)), int(r.num_tokens))
                for _, r in zip(range(k), vc.waiting_queue(self))]

    def _anchorage_reorder(self) -> None:
        from anchorage.policies.admission import admission_order

        q = vc.waiting_queue(self)
        if len(q) < 2:
            if not q:
                self._anchorage_hits.clear()
            return
        head: list = []  # requests stock must resume first: their order is kept
        fresh: list = []
        rest: list = []
        window = self.anchorage_window
        for r in q:
            if not vc.is_fresh_waiting(r):
                head.append(r)
            elif len(fresh) < window:
                fresh.append(r)
            else:
                rest.append(r)
        if len(fresh) < 2:
            return
        pool = getattr(self, "_anchorage_pool", None)
        if pool is not None:  # reset_prefix_cache replaces the map: re-read it each step
            self._anchorage_lookup = vc.cached_lookup(pool)
        order = admission_order(fresh, self._anchorage_new_blocks,
                                self._anchorage_arrival, time.time(),
                                params=self.anchorage_admission)
        if any(a is not b for a, b in zip(order, fresh)):
            self.anchorage_reorders += 1
        new = head + order + rest
        if any(a is not b for a, b in zip(new, q)):
            q.clear()
            q.extend(new)
        if len(self._anchorage_hits) > 4 * window:
            live = {r.request_id for r in fresh}
            self._anchorage_hits = {k: v for k, v in self._anchorage_hits.items() if k in live}

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.anchorage_enabled:
            try:
                self._anchorage_reorder()
            except Exception:  # the queue is intact: stock order this step
                self.anchorage_errors += 1
                if self.anchorage_errors == 1:
                    log.warning("anchorage: prefix-aware reordering failed; stock order for "
                                "this step", exc_info=True)
                if self.anchorage_errors >= MAX_ERRORS:
                    self.anchorage_enabled = False
                    log.warning("anchorage: prefix-aware admission off after %d errors",
                                self.anchorage_errors)
        return super().schedule(*args, **kwargs)


_CLASSES: dict[str, type] = {}


def _classes() -> dict[str, type]:
    if not _CLASSES:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        def make(base: type, name: str) -> type:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                base.__init__(self, *args, **kwargs)
                self._anchorage_init()

            return type(name, (PrefixAwareMixin, base),
                        {"__init__": __init__, "__module__": __name__,
                         "__doc__": f"vLLM's {base.__name__} with prefix-aware admission."})

        _CLASSES["PrefixAwareScheduler"] = make(Scheduler, "PrefixAwareScheduler")
        _CLASSES["PrefixAwareAsyncScheduler"] = make(AsyncScheduler, "PrefixAwareAsyncScheduler")
    return _CLASSES


def __getattr__(name: str) -> Any:
    """``PrefixAwareScheduler`` / ``PrefixAwareAsyncScheduler``, built on first access so
    that importing this module never imports vLLM."""
    if name in ("PrefixAwareScheduler", "PrefixAwareAsyncScheduler"):
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
