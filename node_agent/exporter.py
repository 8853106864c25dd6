"""The plugin's snapshot exporter: a daemon thread writing ``state.json`` for the sidecar.

In the engine (``node_agent.vllm_hooks``)::

    state = NodeState(block_size=pool.hash_block_size)          # node_agent.recorder
    exporter = PolicyStateExporter(policy, state_path(), node_state=state,
                                   stats=block_pool_stats(name), policy_name=name,
                                   config_generation=lambda: generation_in_force).start()
    exporter.stop()  # at shutdown (also a daemon thread: never blocks exit)

Every ``interval_s`` (never on the allocation path) it reads the policy through its
introspection interface (``policy_view``: predictability, predictions, protected blocks,
tiering; ``anchorage.policies.base``), the recorder's anchors, counters, histogram and
sampled requests, the block-pool driver's counters (``stats``) and the sidecar's sample
rate (``sidecar.json``), builds a ``node_agent.snapshot.Snapshot`` and writes it
atomically. ``predictions[*].probability`` is the chance that at least one active session
calls the agent next, ``1 - exp(-s)`` with ``s = sum_i N_i P(j | i)`` from
``PrefetchAdvisor.warm_candidates`` (Poisson approximation).

``config_generation`` and ``config_rejected`` (callables or ints) are the engine's
``ANCHORAGE_CONFIG`` generation in force and how many versions it refused
(``node_agent.reload`` sets them; ``config_rejected`` None: not reported).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from anchorage.node_agent.recorder import OUTCOMES, NodeState, agent_label
from anchorage.node_agent.snapshot import (Anchor, Counters, Prediction, Snapshot, Tiering,
                                           read_settings, state_path, write_snapshot)

log = logging.getLogger("anchorage.node_agent.state")


def policy_view(policy: Any, k: int = 8) -> dict[str, Any]:
    """Predictability, predictions and protected blocks of a policy, through its
    introspection interface (``anchorage.policies.base``; read from another thread: a
    concurrent change of a dict during iteration raises RuntimeError, which the exporter
    retries)."""
    out: dict[str, Any] = {"policy": getattr(policy, "name", None), "predictability": 0.0,
                           "predictions": [], "protected_blocks": {"anchor": 0, "session": 0}}
    tiering = policy.tiering_view()  # ANCHORAGE_TIERING (node_agent/tiering)
    if tiering is not None:
        out["tiering"] = tiering
    from anchorage.policies.cachescout import PrefetchAdvisor

    adv = PrefetchAdvisor(policy)
    out["predictability"] = float(adv.predictability())
    out["predictions"] = [{"agent": agent_label(a), "probability": round(1 - math.exp(-s), 6)}
                          for a, s in adv.warm_candidates(k) if s > 0 and a is not None
                          and isinstance(a, (bytes, int, str))]
    out["protected_blocks"] = dict(policy.protected_blocks())
    return out


def _with_prompts(tiering: dict[str, Any] | None, st: NodeState | None) -> dict[str, Any] | None:
    """The temporal controller's pending reloads with the session's last prompt (token ids
    and cache salt) from the plugin's registry; a reload whose prompt is unknown is left
    out (nothing to warm)."""
    if not tiering or "pending_reloads" not in tiering:
        return tiering
    out = dict(tiering)
    pend = []
    for r in tiering["pending_reloads"]:
        p = st.prompts.get(r["session"]) if st is not None else None
        if p is not None:
            pend.append({**r, "token_ids": p[0], "cache_salt": p[1]})
    out["pending_reloads"] = pend
    return out


def block_pool_stats(policy_name: str) -> Callable[[], dict[str, Any]]:
    """The exporter's ``stats`` from the block-pool driver's process-wide counters:
    victims in the policy's order (reason ``lru`` for the ``lru`` policy, else ``policy``),
    victims in stock recency order (``lru``: the policy had none left, or it failed),
    policy errors."""

    def stats() -> dict[str, Any]:
        from anchorage.node_agent.vllm_block_pool import STATS

        ev: dict[str, int] = {}
        ev["lru" if policy_name == "lru" else "policy"] = STATS.victims
        ev["lru"] = ev.get("lru", 0) + STATS.stock_victims
        return {"evictions": ev, "policy_errors": STATS.errors}

    return stats


def _value(v: Callable[[], int] | int) -> int:
    return int((v() if callable(v) else v) or 0)


class PolicyStateExporter:
    """Writes the snapshot every ``interval_s`` from a daemon thread.

    ``policy_or_callable``: an eviction policy (its learned model is read with
    ``policy_view``) or a zero-argument callable returning the ``policy_view`` fields
    (stubs, or a plugin that builds them itself; its ``anchors`` in the snapshot's JSON
    form when there is no ``node_state``). ``stats``: optional callable returning
    ``{"evictions": {reason: n}, "policy_errors": n}`` (the block-pool driver's counters).
    """

    def __init__(self, policy_or_callable: Any, path: str | os.PathLike | None = None,
                 interval_s: float = 0.5, *, node_state: NodeState | None = None,
                 stats: Callable[[], dict[str, Any]] | None = None, mode: str = "active",
                 policy_name: str | None = None,
                 config_generation: Callable[[], int] | int = 0,
                 config_rejected: Callable[[], int] | int | None = None):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.source = policy_or_callable
        self.path = Path(path) if path is not None else state_path()
        self.interval_s = interval_s
        self.node_state = node_state
        self.stats = stats
        self.mode = mode
        self.policy_name = policy_name
        self.config_generation = config_generation
        self.config_rejected = config_rejected
        self.writes = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_view: dict[str, Any] = {}

    def _view(self) -> dict[str, Any]:
        src = self.source
        for _ in range(3):
            try:
                if callable(src) and not hasattr(src, "pop_victim"):
                    v = dict(src())
                else:
                    v = policy_view(src)
                self._last_view = v
                return v
            except RuntimeError:  # the engine thread changed a dict under us: retry
                continue
        return self._last_view

    def build(self) -> Snapshot:
        """The snapshot as of now (``write_once`` writes it)."""
        v = self._view()
        st = self.node_state
        r = float(v.get("predictability", 0.0))
        if st is not None:
            st.predictability = r
        stats = self.stats() if self.stats is not None else {}
        rate = float(read_settings(self.path.parent).get("access_log_sample_rate", 0.0) or 0.0)
        tiering = _with_prompts(v.get("tiering"), st)  # None unless ANCHORAGE_TIERING
        return Snapshot(
            written_s=time.time(), pid=os.getpid(),
            policy=self.policy_name or v.get("policy") or "off", mode=self.mode,
            config_generation=_value(self.config_generation),
            block_size=st.block_size if st is not None else v.get("block_size", 0),
            predictability=r,
            predictions=tuple(Prediction.from_json(p, f"predictions[{i}]")
                              for i, p in enumerate(v.get("predictions", []))),
            counters=Counters(
                evictions=dict(stats.get("evictions", {})),
                policy_errors=int(stats.get("policy_errors", 0)),
                predictions=(dict(st.predictions) if st is not None
                             else dict.fromkeys(OUTCOMES, 0)),
                requests=st.requests_seen if st is not None else 0,
                config_rejected=(None if self.config_rejected is None
                                 else _value(self.config_rejected))),
            protected_blocks=dict(v.get("protected_blocks", {"anchor": 0, "session": 0})),
            decision_seconds=st.histogram() if st is not None else None,
            anchors=(st.anchors.snapshot() if st is not None else
                     tuple(Anchor.from_json(a, f"anchors[{i}]")
                           for i, a in enumerate(v.get("anchors", [])))),
            requests=st.sampled_requests(rate) if st is not None else (),
            tiering=Tiering.from_json(tiering, "tiering") if tiering is not None else None)

    def snapshot(self) -> dict[str, Any]:
        """The snapshot as of now, as the JSON object the file holds."""
        return self.build().to_json()

    def write_once(self) -> None:
        try:
            write_snapshot(self.path, self.build())
            self.writes += 1
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.warning("anchorage: cannot write the node state to %s", self.path,
                            exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write_once()
            self._stop.wait(self.interval_s)

    def start(self) -> PolicyStateExporter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="anchorage-state-exporter")
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
