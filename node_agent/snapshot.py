"""The contract between the vLLM plugin (inside EngineCore) and the node-agent sidecar, typed.

The plugin writes ``$ANCHORAGE_STATE_DIR/state.json`` (``node_agent.exporter``: atomically,
every ``interval_s``, from a daemon thread); the sidecar reads it whenever it likes
(``read_snapshot``). The sidecar tells the plugin its access-log sample rate through
``sidecar.json`` in the same directory (``write_settings`` / ``read_settings``).

Format ``anchorage-node-state/v1``: one JSON object, a ``Snapshot`` (``to_json`` writes it,
``Snapshot.from_json`` reads it)::

    format, written_s (unix time), pid, policy, mode ("active" | "stock"),
    config_generation, block_size,
    predictability            R in [0, 1] (CacheScout eq. 2)
    predictions               [Prediction {"agent": label, "probability": p}], best first
    counters                  Counters {"evictions": {reason: n}, "policy_errors": n,
                               "predictions": {"correct"|"wrong"|"none": n}, "requests": n,
                               "config_rejected": n}
    protected_blocks          {"anchor": n, "session": n}
    decision_seconds          DecisionHistogram {"le": [...], "counts": [...cumulative],
                               "sum": s, "count": n}, or null
    anchors                   [Anchor {"agent", "hint", "token_ids", "first_s",
                               "last_seen_s", "requests", "cache_salt", "tenant"}]
    requests                  [AccessRecord {"seq", "t", "hash_ids", "input_length",
                               "output_length", "session_id", "tenant", "tool_name",
                               "tool_args", "agent"}]  (the access log's feed)
    tiering                   Tiering {"mode", "reserved_blocks", "offloads", "reloads",
                               "bytes", "pending_reloads": [PendingReload]}, or null

Only ``format`` and ``written_s`` are required; a missing field reads as its default.
Anything of the wrong type is a ``StateError`` naming the file and the field
(``anchors[2].token_ids: must be a list of ints``).

Compatibility (the plugin and the sidecar ship in different images, so either may be the
older one): fields are never renamed or removed. Fields added after the first release
(``counters.config_rejected``, ``anchors[].cache_salt``, ``anchors[].tenant``) are
optional: ``None`` reads as "not reported" and is not written. Top-level fields this reader does not know are kept in
``Snapshot.extensions`` and written back unchanged (a newer plugin's sections pass
through); unknown keys inside a known section are ignored. A snapshot an older plugin
wrote reads and writes back byte for byte (``tests/node_agent/test_snapshot_contract.py``).

Agents are named by label ``fp:<16 hex>`` (``node_agent.recorder.agent_label``), so the
plugin's bytes keys never leave the engine. Cache salts (``anchors[].cache_salt``,
``pending_reloads[].cache_salt``) stay inside the pod: the sidecar sends them only back to
its own engine, with the warm-up of that tenant's prefix.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

log = logging.getLogger("anchorage.node_agent.state")

FORMAT = "anchorage-node-state/v1"
SNAPSHOT_FILE = "state.json"
SETTINGS_FILE = "sidecar.json"
ENV_STATE_DIR = "ANCHORAGE_STATE_DIR"


class StateError(ValueError):
    """A snapshot that cannot be read (the message names the file and the field)."""


def state_path(state_dir: str | os.PathLike | None = None) -> Path:
    d = state_dir if state_dir is not None else os.environ.get(ENV_STATE_DIR) or "/tmp/anchorage"
    return Path(d) / SNAPSHOT_FILE


# -- field readers: each raises StateError("<where>: ...") ----------------------------------


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise StateError(f"{where}: must be an object, not {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise StateError(f"{where}: must be a list, not {type(v).__name__}")
    return v


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise StateError(f"{where}: must be an integer, not {v!r}")
    return int(v)


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StateError(f"{where}: must be a number, not {v!r}")
    return float(v)


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise StateError(f"{where}: must be a string, not {v!r}")
    return v


def _str_or_none(v: Any, where: str) -> str | None:
    return v if isinstance(v, str) else None   # another type reads as absent


def _any(v: Any, where: str) -> Any:
    return v


def _counts(v: Any, where: str) -> dict[str, int]:
    return {str(k): _int(n, f"{where}.{k}") for k, n in _obj(v, where).items()}


def _ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(type(t) is int for t in v):
        raise StateError(f"{where}: must be a list of ints")
    return v  # not copied: anchors are long


def _prompt(v: Any, where: str) -> list[int]:
    if not v or not isinstance(v, list) or not all(type(t) is int for t in v):
        raise StateError(f"{where}: must be a non-empty list of ints")
    return v


def _pid(v: Any, where: str) -> int | None:
    return v if type(v) is int else None


def _buckets(v: Any, where: str) -> list[float | str]:
    return [b if b == "+Inf" else _num(b, f"{where}[{i}]") for i, b in enumerate(_list(v, where))]


def _section(cls: type) -> Callable[[Any, str], Any]:
    return lambda v, where: cls.from_json(v, where)


def _sections(cls: type) -> Callable[[Any, str], tuple]:
    return lambda v, where: tuple(cls.from_json(x, f"{where}[{i}]")
                                  for i, x in enumerate(_list(v, where)))


def _f(read: Callable[[Any, str], Any], default: Any = MISSING, *, factory: Any = MISSING,
       omit_none: bool = False) -> Any:
    """A JSON field: how to read it, its default when missing or null (none: required),
    and whether None is left out when writing (the fields added after the first release)."""
    return field(default=default, default_factory=factory,
                 metadata={"read": read, "omit_none": omit_none})


def _plain(v: Any) -> Any:
    if isinstance(v, _Section):
        return v.to_json()
    if isinstance(v, tuple) and v and isinstance(v[0], _Section):
        return [x.to_json() for x in v]
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Mapping):
        return dict(v)
    return v


def _read(cls: type, d: Mapping[str, Any], where: str, sep: str = ".") -> Any:
    """``cls`` from the JSON object ``d``: each field by its reader; missing or null, its
    default (a field without one is required)."""
    kw = {}
    for f in fields(cls):
        if "read" not in f.metadata:
            continue
        v = d.get(f.name)
        at = f"{where}{sep}{f.name}"
        if v is not None:
            kw[f.name] = f.metadata["read"](v, at)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise StateError(f"{at}: required")
    try:
        return cls(**kw)
    except StateError as exc:  # a check across fields (__post_init__)
        raise StateError(f"{where}: {exc}") from None


class _Section:
    """A JSON object of the snapshot: its dataclass fields, in order, are its keys."""

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.metadata["omit_none"]:
                continue
            out[f.name] = _plain(v)
        return out

    @classmethod
    def from_json(cls, d: Any, where: str):
        return _read(cls, _obj(d, where), where)


# -- sections ---------------------------------------------------------------------------------

_frozen = dataclass(frozen=True, kw_only=True)


@_frozen
class Prediction(_Section):
    """P(at least one active session calls ``agent`` next)."""

    agent: str = _f(_str)
    probability: float = _f(_num)


@_frozen
class Anchor(_Section):
    """One agent's anchor: the token ids of the longest shared prefix seen with its
    fingerprint, and the cache salt and tenant of the request they come from (None:
    unsalted; a warm-up of the anchor carries the same salt)."""

    agent: str = _f(_str)
    hint: str | None = _f(_str, None)
    token_ids: Sequence[int] = _f(_ints)
    first_s: float = _f(_num, 0.0)
    last_seen_s: float = _f(_num, 0.0)
    requests: int = _f(_int, 1)
    cache_salt: str | None = _f(_str, None, omit_none=True)
    tenant: str | None = _f(_str, None, omit_none=True)


@_frozen
class Counters(_Section):
    """The engine process's totals (the sidecar mirrors them on /metrics).
    ``config_rejected``: versions of ``ANCHORAGE_CONFIG`` the engine refused (None: an
    older plugin that does not report it)."""

    evictions: Mapping[str, int] = _f(_counts, factory=dict)
    policy_errors: int = _f(_int, 0)
    predictions: Mapping[str, int] = _f(_counts, factory=dict)
    requests: int = _f(_int, 0)
    config_rejected: int | None = _f(_int, None, omit_none=True)


@_frozen
class DecisionHistogram(_Section):
    """Cumulative histogram of victim-choice times: ``counts[i]`` decisions took at most
    ``le[i]`` seconds (the last ``le`` is ``"+Inf"``)."""

    le: Sequence[float | str] = _f(_buckets, ())
    counts: Sequence[int] = _f(_ints, ())
    sum: float = _f(_num, 0.0)
    count: int = _f(_int, 0)

    def __post_init__(self) -> None:
        if len(self.le) != len(self.counts):
            raise StateError("le and counts differ in length")


@_frozen
class AccessRecord(_Section):
    """One recent real request of a sampled session (the access log's feed)."""

    seq: int = _f(_int, 0)
    t: float = _f(_num, 0.0)
    hash_ids: Sequence[int] = _f(_ints, ())
    input_length: int = _f(_int, 0)
    output_length: int = _f(_int, 0)
    session_id: str | None = _f(_str, None)
    tenant: str | None = _f(_str, None)
    tool_name: str | None = _f(_str, None)
    tool_args: Any = _f(_any, None)
    agent: str | None = _f(_str, None)


@_frozen
class PendingReload(_Section):
    """A reload warm-up the temporal controller scheduled at ``at_s`` (unix time): the
    session's last prompt, under its cache salt."""

    id: str = _f(_str)
    session: str = _f(_str)
    at_s: float = _f(_num)
    blocks: int = _f(_int, 0)
    agent: str | None = _f(_str_or_none, None)
    tenant: str | None = _f(_str_or_none, None)
    token_ids: Sequence[int] = _f(_prompt)
    cache_salt: str | None = _f(_str_or_none, None)


@_frozen
class Tiering(_Section):
    """``ANCHORAGE_TIERING``'s section (docs/tiering.md): the mode, the reserved blocks per
    agent and, from an engine that offloads, the offload/reload/bytes counters and the
    pending reloads. A counter the engine does not report is None (never a made-up 0)."""

    mode: str = _f(_str, "spatial")
    reserved_blocks: Mapping[str, int] | None = _f(_counts, None, omit_none=True)
    offloads: Mapping[str, int] | None = _f(_counts, None, omit_none=True)
    reloads: Mapping[str, int] | None = _f(_counts, None, omit_none=True)
    bytes: Mapping[str, int] | None = _f(_counts, None, omit_none=True)
    pending_reloads: Sequence[PendingReload] | None = _f(_sections(PendingReload), None,
                                                        omit_none=True)


# -- the snapshot -----------------------------------------------------------------------------


@_frozen
class Snapshot(_Section):
    written_s: float = _f(_num)
    pid: int | None = _f(_pid, None)
    policy: str = _f(_str, "off")
    mode: str = _f(_str, "stock")
    config_generation: int = _f(_int, 0)
    block_size: int = _f(_int, 0)
    predictability: float = _f(_num, 0.0)
    predictions: Sequence[Prediction] = _f(_sections(Prediction), ())
    counters: Counters = _f(_section(Counters), factory=Counters)
    protected_blocks: Mapping[str, int] = _f(_counts,
                                             factory=lambda: {"anchor": 0, "session": 0})
    decision_seconds: DecisionHistogram | None = _f(_section(DecisionHistogram), None)
    anchors: Sequence[Anchor] = _f(_sections(Anchor), ())
    requests: Sequence[AccessRecord] = _f(_sections(AccessRecord), ())
    tiering: Tiering | None = _f(_section(Tiering), None)
    # sections of a newer plugin, kept and written back (not a JSON key of their own)
    extensions: Mapping[str, Any] = field(default_factory=dict, metadata={"extension": True})

    @cached_property
    def anchor_by_agent(self) -> Mapping[str, Anchor]:
        return {a.agent: a for a in self.anchors}

    def to_json(self) -> dict[str, Any]:
        d = {"format": FORMAT}
        d.update((f.name, _plain(getattr(self, f.name))) for f in fields(self)
                 if "extension" not in f.metadata)
        d.update(self.extensions)
        return d

    @classmethod
    def from_json(cls, doc: Any, where: str = "snapshot") -> "Snapshot":
        if not isinstance(doc, dict):
            raise StateError(f"{where}: not a JSON object")
        if doc.get("format") != FORMAT:
            raise StateError(f"{where}: format {doc.get('format')!r}, expected {FORMAT!r}")
        snap = _read(cls, doc, where, ": ")
        known = {f.name for f in fields(cls) if "read" in f.metadata} | {"format"}
        ext = {k: v for k, v in doc.items() if k not in known}
        return replace(snap, extensions=ext) if ext else snap


def parse_snapshot(doc: Any, where: str = "snapshot") -> Snapshot:
    return Snapshot.from_json(doc, where)


def write_json(path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
    """Atomic: readers see the previous file or this one, never a partial write."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    data = json.dumps(doc, separators=(",", ":"))
    try:
        fh = open(tmp, "w")
    except FileNotFoundError:  # the directory first (not on every write: it is a syscall)
        p.parent.mkdir(parents=True, exist_ok=True)
        fh = open(tmp, "w")
    with fh:
        fh.write(data)
    os.replace(tmp, p)


class BackgroundWriter:
    """``write_json`` from a daemon thread, for a writer on the engine's step path (the
    host tier's snapshot is built in the scheduler's step): ``submit`` only hands the
    document over, the serialization and the file system's calls happen here. The latest
    document per path wins (one submitted before the previous was written replaces it).
    A failed write is counted (``errors``) and logged once; ``flush`` waits until every
    submitted document is written (tests, shutdown)."""

    def __init__(self, name: str = "anchorage-writer"):
        self.name = name
        self.writes = self.errors = 0
        self._pending: dict[str, Mapping[str, Any]] = {}
        self._busy = False
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
        with self._cv:
            self._pending[str(path)] = doc
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
                self._thread.start()
            self._cv.notify_all()

    def flush(self, timeout_s: float = 2.0) -> bool:
        """True when everything submitted was written (or failed) within ``timeout_s``."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._pending and not self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._pending))
                path, doc = self._pending.popitem()
                self._busy = True
            try:
                write_json(path, doc)
                self.writes += 1
            except (OSError, RuntimeError, TypeError, ValueError):
                self.errors += 1
                if self.errors == 1:
                    log.warning("anchorage: cannot write %s", path, exc_info=True)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


def write_snapshot(path: str | os.PathLike, snap: Snapshot) -> None:
    write_json(path, snap.to_json())


def read_snapshot(path: str | os.PathLike) -> Snapshot | None:
    """The plugin's latest snapshot; None when there is none yet."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StateError(f"{path}: not JSON ({exc})") from None
    return Snapshot.from_json(doc, str(path))


# -- the sidecar's settings for the plugin (sidecar.json) -------------------------------------


def write_settings(state_dir: str | os.PathLike, *, access_log_sample_rate: float) -> None:
    write_json(Path(state_dir) / SETTINGS_FILE,
               {"access_log_sample_rate": float(access_log_sample_rate)})


def read_settings(state_dir: str | os.PathLike) -> dict[str, Any]:
    try:
        doc = json.loads((Path(state_dir) / SETTINGS_FILE).read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}
