"""The sidecar's configuration: its typed settings (``SidecarConfig``, from the command
line) and its reading of the operator's ``ANCHORAGE_CONFIG`` document.

The document (``anchorage.config.document``, the one parser the plugin, the sidecar, the
router and the operator share) sets three warm-up knobs over the command line's:
``policy.parameters`` ``prefetch.enabled`` (over ``--no-warmup``), ``prefetch.ratePerSecond``
(over ``--warmup-rate``) and ``rMin`` (over ``--warmup-r-min``); a knob the document omits
is the command line's. ``ConfigFollower.poll()`` re-reads the file only when its
``(mtime_ns, size, inode)`` changed (a ConfigMap update swaps a symlink: the inode
changes); a document the parser rejects (empty, truncated, not YAML, an unknown field, a
value out of range...) is one warning and counted (``rejected``), and that version is not
read again.

One source of truth: the engine's plugin reports the generation it runs in its snapshot
(``config_generation``); the sidecar applies only that document's settings, so the two
never disagree about the generation in force (``ConfigFollower.follow``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

from anchorage.access_log import AccessLogConfig
from anchorage.config import document
from anchorage.warmup import ReloadConfig, WarmupConfig

log = logging.getLogger("anchorage.node_agent.sidecar")


@dataclass(frozen=True)
class SidecarConfig:
    engine_url: str = "http://127.0.0.1:8000"
    kv_events: str | None = None
    kv_topic: str = "kv"
    state_dir: str = "/run/anchorage"
    host: str = "127.0.0.1"
    port: int = 9400
    access_log_port: int | None = None  # the access log's own port (None: not served)
    access_log_token: str = field(default="", repr=False)  # ANCHORAGE_ACCESS_LOG_TOKEN
    model_name: str | None = None       # None: asked from the engine's /v1/models
    config_path: str | None = None      # ANCHORAGE_CONFIG
    policy_env: str | None = None       # ANCHORAGE_POLICY (policy_info before a snapshot)
    tick_s: float = 0.5
    snapshot_max_age_s: float = 5.0
    snapshot_grace_s: float = 60.0      # no snapshot this long after the engine is up: stock
    request_timeout_s: float = 60.0
    horizon_s: float = 600.0
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    reload: ReloadConfig = field(default_factory=ReloadConfig)  # temporal tiering's warm-ups
    access_log: AccessLogConfig = field(default_factory=lambda: AccessLogConfig(sample_rate=0.05))

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.snapshot_max_age_s <= 0:
            raise ValueError("tick_s and snapshot_max_age_s must be positive")
        for name in ("port", "access_log_port"):
            port = getattr(self, name)
            if port is not None and not 0 <= port < 65536:
                raise ValueError(f"{name.replace('_', ' ')} {port} is out of range")
        if self.access_log_port is not None and not self.access_log_token:
            raise ValueError("serving the access log needs the operator's token "
                             "(ANCHORAGE_ACCESS_LOG_TOKEN): it holds every tenant's sessions "
                             "and tool arguments")
        if not self.engine_url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL must be http(s)://..., got {self.engine_url!r}")
        if self.kv_events is not None and not self.kv_events.startswith(("ipc://", "tcp://")):
            raise ValueError(f"KV events endpoint must be ipc://... or tcp://..., "
                             f"got {self.kv_events!r}")

    def policy_configured(self) -> bool:
        """``ANCHORAGE_POLICY`` names a policy: the engine's plugin is meant to run."""
        return (self.policy_env or "").strip().lower() not in ("", "off", "none", "stock")


def read_config_file(path: str) -> tuple[int, dict[str, Any]]:
    """(generation, warm-up overrides) of the operator's document: ``policy.parameters``
    ``rMin``, ``prefetch.enabled`` and ``prefetch.ratePerSecond`` as ``WarmupConfig`` fields
    (``r_min``, ``enabled``, ``rate_per_s``); the ones the document omits are not
    overridden. Raises ``ConfigError`` (a ValueError)."""
    doc = document.read(path)
    return doc.generation, doc.policy.parameters.warmup_overrides()


class ConfigFollower:
    """The warm-up settings in force, from ``ANCHORAGE_CONFIG`` documents. Never raises.

    ``poll()`` reads the file when it changed; a valid document is remembered by its
    generation (the last ``keep``), a refused one is one warning and counted
    (``rejected``). ``follow(generation)`` puts in force the settings of the document
    with that generation: the engine's, whenever its plugin runs a policy (it may refuse a
    document the parser takes, e.g. parameters its policy rejects: the sidecar then keeps
    the settings of the generation the engine does run), else (``None``) the latest
    document read. Generation 0 is the command line's settings (no document).
    """

    def __init__(self, path: str | None, base: WarmupConfig, keep: int = 16):
        self.path = path
        self.base = base
        self.keep = keep
        self.rejected = 0           # versions this sidecar's parser refused
        self.generation = 0         # the document whose settings are in force
        self.warmup = base
        self._read: dict[int, WarmupConfig] = {}
        self._latest: int | None = None
        self._version: tuple[int, int, int] | None = None
        self._missing: int | None = None

    def poll(self) -> None:
        if not self.path:
            return
        try:
            st = os.stat(self.path)
        except OSError:
            return
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._version:
            return
        self._version = version
        try:
            gen, over = read_config_file(self.path)
            wc = replace(self.base, **over)
        except (OSError, ValueError, TypeError) as exc:
            self.rejected += 1
            log.warning("config %s not applied: %s", self.path, exc)
            return
        self._read.pop(gen, None)
        self._read[gen] = wc
        while len(self._read) > self.keep:
            self._read.pop(next(iter(self._read)))
        self._latest = gen

    def follow(self, generation: int | None) -> WarmupConfig | None:
        """The new settings when the generation in force changes, else None."""
        gen = self._latest if generation is None else generation
        if gen is None or gen == self.generation:
            return None
        wc = self.base if gen == 0 else self._read.get(gen)
        if wc is None:
            if self._missing != gen:
                self._missing = gen
                log.info("the engine runs config generation %d, which this node agent has "
                         "not read; warm-up settings of generation %d stay", gen,
                         self.generation)
            return None
        self.generation, self.warmup = gen, wc
        log.info("config %s generation %d in force (warm-ups %s, %g/s, R_min %g)", self.path,
                 gen, "on" if wc.enabled else "off", wc.rate_per_s, wc.r_min)
        return wc
