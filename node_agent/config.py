"""The plugin's view of the operator's config (``ANCHORAGE_CONFIG``): precedence and watch.

Specification
-------------
Input: the environment (``ANCHORAGE_POLICY``, ``ANCHORAGE_CONFIG``,
``ANCHORAGE_CONFIG_CHECK_S``) and the file ``ANCHORAGE_CONFIG`` names, the operator's
ConfigMap data key ``anchorage.yaml``, parsed by ``anchorage.config`` (the document's one
parser; its rules, e.g. the end marker ``...``, are in ``anchorage.config.document``)::

    generation: 3
    policy: {name: hybrid, parameters: {survivalThreshold: 0.3, rMin: 0.5}}
    ...

Output: a ``PolicyConfig(name, params, generation, source)``.

Precedence:

1. ``ANCHORAGE_POLICY`` unset, empty or ``off``: the plugin is off; the file is never read
   (the config cannot switch a stock engine on).
2. Otherwise the policy is the document's ``policy.name``; without a file (or before it
   appears) ``ANCHORAGE_POLICY`` with the policy's defaults, generation 0.
3. Parameters are the document's ``policy.parameters`` (``anchorage.config.parameters``)
   as the policy's keyword arguments (``survivalThreshold`` -> ``survival_threshold``,
   ``prefetch.enabled`` -> ``prefetch``...); omitted ones take the policy's defaults.

A document the parser rejects (empty, truncated, not YAML, an unknown field, a value out
of range, an unknown or offline-only policy...) is rejected with one ``ConfigError`` line
(the caller keeps what it has). Whether the policy accepts the parameters is checked by
building it (``TypeError``/``ValueError`` -> rejected), which the engine side does
(``anchorage.node_agent.reload``).

Watching: ``ConfigWatcher.poll(now)`` stats the file at most once per ``check_s``
(default 5 s) and parses it only when ``(mtime_ns, size, inode)`` changed (a ConfigMap
update swaps a symlink: the inode changes). A rejected version is warned about once and
not re-read until the file changes again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anchorage.config import document
from anchorage.config.parameters import ConfigError  # noqa: F401  (raised to callers)

log = logging.getLogger("anchorage.node_agent")

ENV_POLICY = "ANCHORAGE_POLICY"
ENV_CONFIG = "ANCHORAGE_CONFIG"
ENV_CHECK_S = "ANCHORAGE_CONFIG_CHECK_S"
OFF = ("", "off", "none", "stock")
DEFAULT_CHECK_S = 5.0


@dataclass(frozen=True)
class PolicyConfig:
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    source: str = "env"  # "env": ANCHORAGE_POLICY and defaults; "config": the file


def env_policy(environ: dict[str, str] | None = None) -> str | None:
    """``ANCHORAGE_POLICY`` normalised; None when the plugin is off."""
    env = os.environ if environ is None else environ
    name = env.get(ENV_POLICY, "").strip().lower()
    return None if name in OFF else name


def check_interval_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(ENV_CHECK_S, "").strip()
    if not raw:
        return DEFAULT_CHECK_S
    try:
        v = float(raw)
    except ValueError:
        log.warning("anchorage: %s=%r is not a number; using %g s", ENV_CHECK_S, raw,
                    DEFAULT_CHECK_S)
        return DEFAULT_CHECK_S
    return max(0.0, v)


def _policy_config(doc: document.ConfigDocument) -> PolicyConfig:
    return PolicyConfig(doc.policy.name, doc.policy.parameters.policy_kwargs(),
                        doc.generation, "config")


def parse_policy_config(text: str) -> PolicyConfig:
    """The policy config a document's text gives. Raises ``ConfigError``."""
    return _policy_config(document.parse(text))


def read_policy_config(path: str) -> PolicyConfig:
    return _policy_config(document.read(path))


def _file_version(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ConfigWatcher:
    """Decides when to (re-)read ``path`` and what it says. Never raises.

    ``poll(now_s)`` returns a new ``PolicyConfig`` when the file changed and parses,
    else None (not time yet, unchanged, missing, or rejected: warned once per version).
    ``reject(cfg, why)`` marks a parsed config the caller could not apply (one warning).
    """

    def __init__(self, path: str, env_name: str, check_s: float = DEFAULT_CHECK_S,
                 version: Callable[[str], Any] = _file_version):
        self.path = path
        self.env_name = env_name
        self.check_s = check_s
        self._version = version
        self._seen: Any = None  # file version last read (applied or rejected)
        self._next_s = float("-inf")
        self.rejected = 0  # versions not applied (bad file or parameters)

    def load(self) -> PolicyConfig | None:
        """Read now (at start): the config, or None when missing or rejected."""
        self._seen = self._version(self.path)
        if self._seen is None:
            log.warning("anchorage: %s=%s does not exist (yet); policy %r with its defaults "
                        "until it does", ENV_CONFIG, self.path, self.env_name)
            return None
        return self._read()

    def _read(self) -> PolicyConfig | None:
        try:
            return read_policy_config(self.path)
        except ConfigError as exc:
            self.warn_rejected(str(exc))
            return None

    def warn_rejected(self, why: str) -> None:
        self.rejected += 1
        log.warning("anchorage: config %s not applied (%s); the previous config stays in "
                    "force", self.path, why)

    def due(self, now_s: float) -> bool:
        return now_s >= self._next_s

    def poll(self, now_s: float) -> PolicyConfig | None:
        if now_s < self._next_s:
            return None
        self._next_s = now_s + self.check_s
        v = self._version(self.path)
        if v is None or v == self._seen:
            return None
        self._seen = v
        return self._read()
