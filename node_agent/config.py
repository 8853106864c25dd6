"""The plugin's view of the operator's config (``ANCHORAGE_CONFIG``): parse, precedence, watch.

Specification
-------------
Input: the environment (``ANCHORAGE_POLICY``, ``ANCHORAGE_CONFIG``,
``ANCHORAGE_CONFIG_CHECK_S``) and the file ``ANCHORAGE_CONFIG`` names, the operator's
ConfigMap data key ``anchorage.yaml`` (``anchorage.operator.config``)::

    generation: 3
    policy: {name: hybrid, parameters: {survivalThreshold: 0.3, warmup: {...}, ...}}

Output: a ``PolicyConfig(name, params, generation, source)``.

Precedence:

1. ``ANCHORAGE_POLICY`` unset, empty or ``off``: the plugin is off; the file is never read
   (the config cannot switch a stock engine on).
2. Otherwise the policy is ``policy.name`` of the file when it names one, else
   ``ANCHORAGE_POLICY``.
3. Parameters are ``policy.parameters`` of the file, in the CRD's names, mapped to the
   policy's keyword arguments by ``anchorage.autoscale.params`` (``survivalThreshold`` ->
   ``survival_threshold``, ``rMin`` -> ``r_min``...; other names pass through unchanged).
   Everything passes through (the operator's tuning names included), except ``warmup``,
   the sidecar's own warm-up overrides (``docs/node-agent.md``). No file, or a file
   without ``policy``: the policy's defaults, generation 0.

A file that is not YAML, not a mapping, whose ``generation`` is not an integer, whose
``policy`` or ``parameters`` is not a mapping, or that names an unknown or offline-only
policy is rejected with one ``ConfigError`` line (the caller keeps what it has). Whether
the policy accepts the parameters is checked by building it (``TypeError``/``ValueError``
-> rejected), which the engine side does (``anchorage.node_agent.reload``).

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

log = logging.getLogger("anchorage.node_agent")

ENV_POLICY = "ANCHORAGE_POLICY"
ENV_CONFIG = "ANCHORAGE_CONFIG"
ENV_CHECK_S = "ANCHORAGE_CONFIG_CHECK_S"
OFF = ("", "off", "none", "stock")
DEFAULT_CHECK_S = 5.0
# policy.parameters only the sidecar reads (its warm-up overrides); not passed to the policy
SIDECAR_ONLY = frozenset({"warmup"})


class ConfigError(ValueError):
    """A config that cannot be applied; the message is one line for the log."""


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


def policy_params(parameters: Any) -> dict[str, Any]:
    """CRD-named ``policy.parameters`` -> the policy's keyword arguments."""
    from anchorage.autoscale.params import flatten, policy_kwargs

    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"policy.parameters must be a mapping, not {type(parameters).__name__}")
    flat = {k: v for k, v in flatten(parameters).items() if k not in SIDECAR_ONLY}
    return policy_kwargs(flat)


def _check_name(name: str) -> str:
    from anchorage.policies.registry import is_offline, policy_names

    if name not in policy_names(include_offline=True):
        raise ConfigError(f"policy {name!r} is not a known policy (known: "
                          f"{', '.join(policy_names(include_offline=False))})")
    if is_offline(name):
        raise ConfigError(f"policy {name!r} reads the future and exists only in the simulator")
    return name


def parse_policy_config(text: str, env_name: str) -> PolicyConfig:
    """The policy config a file's text gives, ``env_name`` (``ANCHORAGE_POLICY``) being the
    policy when the file names none. Raises ``ConfigError``."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"the document must be a mapping, not {type(doc).__name__}")
    gen = doc.get("generation", 0)
    if type(gen) is not int or gen < 0:
        raise ConfigError(f"generation must be a non-negative integer, not {gen!r}")
    policy = doc.get("policy")
    if policy is None:
        return PolicyConfig(_check_name(env_name), {}, gen, "config")
    if not isinstance(policy, dict):
        raise ConfigError(f"policy must be a mapping, not {type(policy).__name__}")
    name = policy.get("name")
    if name is None:
        name = env_name
    elif not isinstance(name, str) or not name.strip():
        raise ConfigError(f"policy.name must be a policy name, not {name!r}")
    name = _check_name(name.strip().lower())
    return PolicyConfig(name, policy_params(policy.get("parameters")), gen, "config")


def read_policy_config(path: str, env_name: str) -> PolicyConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read it ({exc.__class__.__name__}: {exc})") from None
    return parse_policy_config(text, env_name)


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
            return read_policy_config(self.path, self.env_name)
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
