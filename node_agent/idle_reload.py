"""Applying a changed ``ANCHORAGE_CONFIG`` while the engine is idle.

Specification
-------------
``reload.PolicyReloader.maybe_reload`` runs at the start of every scheduling attempt. An
idle engine schedules nothing, so without this module a document written while no request
comes (an ``AgentCachePolicy`` edited at a quiet hour) is neither in force nor reported
(``anchorage_config_generation``, and the sidecar's warm-up settings, which follow the
generation the engine runs) until the next request arrives.

In vLLM's engine-core process (``EngineCoreProc``, what ``vllm serve`` runs) a daemon
thread, started when the engine core's busy loop first polls its input queue, puts vLLM's
own no-op ``WAKEUP`` request, carrying ``TICK``, on that queue every ``interval`` (the
pools' config check interval, ``ANCHORAGE_CONFIG_CHECK_S``, at least ``MIN_INTERVAL_S``).
The engine-core thread, the one that runs the scheduler, takes it off the queue while idle
or between two engine steps and calls every pool's ``maybe_reload``: the same thread and
the same consistency as a scheduling attempt (no allocation or free in progress), so the
swap (``reload.migrate``) is exactly the one a request would have triggered.

Cost: one queue item per interval; per tick one clock read per pool, one ``stat`` when
the check interval has passed; per client request one identity comparison. The thread
stops when the engine core shuts down (``is_running`` false) or is collected. Engines
without a reloader (no ``ANCHORAGE_CONFIG``, plugin off) start no thread; an in-process
engine (``vllm.LLM`` without multiprocessing) has no input queue and keeps reloading at
scheduling attempts only. Never raises into vLLM: a failure is one warning, and the reload
at scheduling attempts stays.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from anchorage.node_agent import vllm_compat as vc

log = logging.getLogger("anchorage.node_agent")

GROUP = "engine"
TICK = "anchorage-config-tick"   # the WAKEUP payload of this module (vLLM's own carries None)
MIN_INTERVAL_S = 1.0
_ORIG = vc.ORIGINALS


def reloaders(core: Any) -> list:
    """The config reloaders of the engine core's pools (empty: none)."""
    return [r for r in (vc.reloader(p) for p in vc.engine_core_pools(core)) if r is not None]


def tick(core: Any) -> int:
    """Run every pool's reload check now (the engine-core thread); how many applied."""
    applied = 0
    for r in reloaders(core):
        applied += bool(r.maybe_reload())   # never raises (reload.PolicyReloader)
    return applied


def _ticker(ref: "weakref.ref", wake: Any, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        core = ref()
        if core is None or not vc.engine_core_running(core):
            return
        vc.engine_core_queue(core).put_nowait((wake, TICK))
        del core


def start(core: Any) -> threading.Thread | None:
    """Start the idle ticker of ``core`` when one of its pools has a reloader."""
    rs = reloaders(core)
    if not rs:
        return None
    interval = max(MIN_INTERVAL_S, min(r.watcher.check_s for r in rs))
    t = threading.Thread(target=_ticker, name="anchorage-config-tick", daemon=True,
                         args=(weakref.ref(core), vc.engine_wakeup_type(), interval,
                               threading.Event()))
    t.start()
    log.info("anchorage: ANCHORAGE_CONFIG checked every %g s while the engine is idle",
             interval)
    return t


def process_input_queue(self: Any) -> Any:
    """``EngineCoreProc._process_input_queue``: the first call starts the ticker, then the
    instance calls vLLM's method directly (no cost per loop iteration after that)."""
    orig = _ORIG["EngineCoreProc._process_input_queue"]
    try:
        self._process_input_queue = functools.partial(orig, self)
        start(self)
    except Exception:  # noqa: BLE001 - reloads at scheduling attempts stay
        log.warning("anchorage: no config checks while the engine is idle", exc_info=True)
    return orig(self)


def handle_client_request(self: Any, request_type: Any, request: Any) -> Any:
    """``EngineCoreProc._handle_client_request``: this module's tick, else vLLM's."""
    if request is TICK:
        try:
            tick(self)
        except Exception:  # noqa: BLE001 - never break the engine loop for a config
            log.warning("anchorage: idle config check failed", exc_info=True)
        return None
    return _ORIG["EngineCoreProc._handle_client_request"](self, request_type, request)
