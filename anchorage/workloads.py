"""Named workloads for benchmarks and the demo: generated topologies and the real traces.

A spec is one of:
- ``generated:<topology>[:<seed>]`` - `anchorage trace generate` with ``DEFAULT_AGENTS``
  agents and ``DEFAULT_SESSIONS`` sessions (or ``sessions=``), the generator's default
  concurrency (or ``concurrency=``);
- ``mooncake`` / ``mooncake-synthetic`` / ``chatdev[:<seed>]`` / ``weka[:<seed>]`` - the
  real traces under the traces directory (``default_traces_dir()``: ``$ANCHORAGE_TRACES``
  when set, else the repository's ``data/traces``), converted on the fly; ChatDev's and
  WEKA's sessions are interleaved over one hour with start offsets drawn from the seed
  (default 0); ``limit=`` keeps the first so many sessions;
- a path to an ``anchorage-trace/v1`` file.
"""

from __future__ import annotations

import os
from pathlib import Path

from anchorage.bench import Workload
from anchorage.trace.format import read_trace

REAL = ("mooncake", "mooncake-synthetic", "chatdev", "weka")
DEFAULT_AGENTS = 8
DEFAULT_SESSIONS = 300


class WorkloadUnavailable(LookupError):
    """The workload's data is not on this machine (message says where it was looked for)."""


# The traces ship in the repository (data/traces, see its SOURCES.md), not in the wheel:
# they are 5.5 MB that the serving images never read. The default is found from this file,
# not the working directory, so the benchmarks and `anchorage bench` work from anywhere
# in a clone; a non-editable install has no repository beside it and says so.
REPO_TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
TRACES_HINT = ("the traces ship in the repository's data/traces (a clone or an editable "
               "install); elsewhere set $ANCHORAGE_TRACES or pass --traces-dir to a folder "
               "with that layout")


def default_traces_dir() -> Path:
    """``$ANCHORAGE_TRACES`` when set, else the repository's ``data/traces``."""
    env = os.environ.get("ANCHORAGE_TRACES")
    if env:
        return Path(env)
    return REPO_TRACES


def trace_path(rel: str, traces_dir: Path | None = None) -> Path:
    """``rel`` under the traces directory; WorkloadUnavailable, naming where it looked and
    how to point elsewhere, when it is not there."""
    return _need((traces_dir or default_traces_dir()) / rel)


def load(spec: str, traces_dir: Path | None = None, *, sessions: int | None = None,
         concurrency: float | None = None, limit: int | None = None) -> Workload:
    traces_dir = traces_dir or default_traces_dir()
    if spec.startswith("generated:"):
        from anchorage.trace.generate import generate

        parts = spec.split(":")
        topology = parts[1]
        seed = _seed(spec, parts[2]) if len(parts) > 2 else 0
        opts = {} if concurrency is None else {"concurrency": concurrency}
        try:
            header, records = generate(topology=topology, agents=DEFAULT_AGENTS,
                                       sessions=sessions or DEFAULT_SESSIONS, seed=seed, **opts)
        except ValueError as exc:
            raise WorkloadUnavailable(f"cannot generate {spec!r}: {exc}") from None
        return Workload.from_records(spec, header, records, source="generated")
    name, _, seed = spec.partition(":")
    if spec in REAL or (seed and name in _REAL_SPECS):
        wl = _load_real(name, traces_dir, _seed(spec, seed) if seed else 0, limit)
        wl.name = spec
        return wl
    p = Path(spec)
    if not p.exists():
        raise WorkloadUnavailable(f"unknown workload {spec!r}: not a generated:<topology>, "
                                  f"one of {', '.join(REAL)} (chatdev and weka take a :<seed>), or an "
                                  f"existing trace file")
    header, records = read_trace(p)
    return Workload.from_records(p.name, header, records, source=str(p))


def _seed(spec: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise WorkloadUnavailable(f"bad seed in workload {spec!r}: {text!r} is not an integer"
                                  ) from None


def _need(path: Path) -> Path:
    if not path.exists():
        raise WorkloadUnavailable(f"{path} not found ({TRACES_HINT})")
    return path


# real dataset -> (converter, path under the traces dir, options)
_REAL_SPECS = {
    "chatdev": ("chatdev", "chatdev", {"window_s": 3600.0}),   # interleaved over one hour
    "weka": ("weka", "weka_claude_code", {}),                   # sessions interleaved
}


def real_records(name: str, traces_dir: Path | None = None, seed: int = 0,
                 limit: int | None = None):
    """``(header, records)`` of a real trace (``REAL``), converted as ``load`` converts it:
    for the timed simulator, which replays records (timestamps, tool durations)."""
    traces_dir = traces_dir or default_traces_dir()
    if name in ("mooncake", "mooncake-synthetic"):
        fname = "conversation_trace.jsonl.xz" if name == "mooncake" else "synthetic_trace.jsonl.xz"
        path = _need(traces_dir / "mooncake" / fname)
        header, records = read_trace(path)
        return header, records, path
    from anchorage.trace.convert import ConvertOptions, convert

    dataset, rel, opts = _REAL_SPECS[name]
    src = _need(traces_dir / rel)
    header, records = convert(dataset, src, ConvertOptions(seed=seed, limit=limit, **opts))
    return header, records, src


def _load_real(name: str, traces_dir: Path, seed: int = 0, limit: int | None = None) -> Workload:
    header, records, src = real_records(name, traces_dir, seed, limit)
    return Workload.from_records(name, header, records, source=str(src))
