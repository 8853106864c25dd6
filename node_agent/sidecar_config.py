"""The sidecar's configuration: its typed settings (``SidecarConfig``, from the command
line) and its reading of the operator's ``ANCHORAGE_CONFIG`` document.

The document (``anchorage.config.document``, the one parser the plugin, the sidecar, the
router and the operator share) sets three warm-up knobs over the command line's:
``policy.parameters`` ``prefetch.enabled`` (over ``--no-warmup``), ``prefetch.ratePerSecond``
(over ``--warmup-rate``) and ``rMin`` (over ``--warmup-r-min``); a knob the document omits
is the command line's. ``ConfigFile.poll()`` re-reads the file only when its ``(mtime_ns,
size, inode)`` changed (a ConfigMap update swaps a symlink: the inode changes); a document
the parser rejects is one warning and counted (``rejected``), and that version is not read
again.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
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
        if not 0 <= self.port < 65536:
            raise ValueError(f"port {self.port} is out of range")
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


class ConfigFile:
    """``ANCHORAGE_CONFIG``, read when it changed. Never raises."""

    def __init__(self, path: str | None):
        self.path = path
        self._version: tuple[int, int, int] | None = None
        self.rejected = 0   # versions the parser refused

    def poll(self) -> tuple[int, dict[str, Any]] | None:
        """(generation, overrides) of a changed, valid document; None otherwise."""
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        if version == self._version:
            return None
        self._version = version
        try:
            return read_config_file(self.path)
        except (OSError, ValueError) as exc:
            self.rejected += 1
            log.warning("config %s not applied: %s", self.path, exc)
            return None
