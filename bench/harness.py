"""What the benchmark scripts share: running a sweep's jobs, the run cache, tables and the
result JSON.

Jobs
----
A sweep is a list of *jobs* (plain data: a dict or tuple) and a module-level function
``fn(job) -> result`` (a dict). ``run_jobs(fn, jobs, fanout)`` returns the results in job
order, whatever order they finish in:

- ``--jobs 1`` (default) and no ``--ray-address``: inline, one after another, in this
  process;
- ``--jobs N``: as Ray tasks on a private local Ray of N CPUs (``ray.init(num_cpus=N,
  include_dashboard=False, _node_ip_address="127.0.0.1")``, shut down afterwards);
- ``--ray-address ADDR``: as Ray tasks on that existing cluster, with this checkout's
  ``anchorage`` and ``bench`` packages shipped to it (``runtime_env`` ``py_modules``), so
  the sweep that runs on a laptop runs unchanged on a cluster;
- Ray is optional (the core install has none): without it, ``--jobs N`` runs on a local
  process pool of N and says so on stderr.

A job's result depends only on the job; module-level caches (a loaded trace) are per
process, so they work in each of these modes.

Run cache
---------
``RunCache(path)`` keeps finished runs as JSON lines ``{"job": job, "row": result}``;
``run_jobs(..., cache=c)`` runs only the jobs it lacks and appends each new result as it
arrives, so an interrupted sweep resumes and sweeps share runs (``--sim-cache`` /
``--cache`` of the router scripts). Merging result files of separate runs (``--merge``) is
per script; ``merge_latest`` and ``replace_rows`` are the two rules they use.

Output
------
``table(columns, rows)`` is the core's one table printer (``anchorage.bench``: terminal or
markdown). ``write_json(path, doc)`` writes a result file: ``doc`` plus a ``meta`` entry
(commit and locally modified files, the command and the ``BENCH_*``/``ANCHORAGE_*``
environment it ran with, machine, UTC time), non-finite floats as null, other objects
as their text.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from anchorage.bench import Column, format_table, machine_description

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
__all__ = ["Column", "Fanout", "RunCache", "ROOT", "RESULTS", "add_fanout_args", "clean",
           "git_state", "merge_latest", "meta", "replace_rows", "run_jobs", "table",
           "write_json"]


# ---------------------------------------------------------------------------------------
# Fan-out

@dataclass(frozen=True)
class Fanout:
    """Where jobs run: ``workers`` 1 and no ``ray_address`` = inline."""

    workers: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.workers}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "Fanout":
        return cls(args.jobs, getattr(args, "ray_address", None))

    @property
    def inline(self) -> bool:
        return self.workers == 1 and not self.ray_address


def add_fanout_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--jobs", type=int, default=1,
                    help="parallel runs: 1 = inline in this process; N = Ray tasks on a "
                         "local Ray of N CPUs (a process pool when Ray is not installed)")
    ap.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="run the jobs as tasks on this existing Ray cluster (e.g. 'auto' "
                         "or ray://head:10001), this checkout's code shipped with them")


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], fanout: Fanout = Fanout(), *,
             cache: "RunCache | None" = None,
             on_result: Callable[[Any, Any], None] | None = None) -> list[Any]:
    """``[fn(job) for job in jobs]``, run as ``fanout`` says; jobs in ``cache`` are not
    run again and new results are added to it. ``on_result(job, result)`` is called as
    each new result arrives (completion order)."""
    results: list[Any] = [None] * len(jobs)
    todo = []
    for i, job in enumerate(jobs):
        if cache is not None and job in cache:
            results[i] = cache[job]
        else:
            todo.append(i)
    for k, res in _execute(fn, [jobs[i] for i in todo], fanout):
        job = jobs[todo[k]]
        results[todo[k]] = res
        if cache is not None:
            cache.put(job, res)
        if on_result is not None:
            on_result(job, res)
    return results


def _execute(fn, jobs: list, fanout: Fanout) -> Iterator[tuple[int, Any]]:
    if not jobs:
        return
    if fanout.inline:
        for i, job in enumerate(jobs):
            yield i, fn(job)
        return
    if not ray_installed():
        if fanout.ray_address:
            raise SystemExit("--ray-address needs Ray: pip install 'anchorage[router]'")
        print(f"note: Ray is not installed (pip install 'anchorage[router]'); running "
              f"{len(jobs)} jobs on a local process pool of {fanout.workers}",
              file=sys.stderr, flush=True)
        yield from _pool(fn, jobs, fanout.workers)
        return
    yield from _ray(fn, jobs, fanout)


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def _call(item: tuple) -> tuple[int, Any]:
    fn, i, job = item
    return i, fn(job)


def _pool(fn, jobs: list, workers: int) -> Iterator[tuple[int, Any]]:
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap_unordered(_call, [(fn, i, j) for i, j in enumerate(jobs)])


def importable(fn: Callable) -> Callable:
    """``fn`` as its module's importable name: a function of a script run as
    ``python -m bench.x`` lives in ``__main__``, which a Ray worker cannot import."""
    if fn.__module__ != "__main__":
        return fn
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None or not spec.name:
        raise SystemExit("run the script as a module (python -m bench.<name>) to fan out "
                         "over Ray")
    return getattr(importlib.import_module(spec.name), fn.__name__)


def _ray(fn, jobs: list, fanout: Fanout) -> Iterator[tuple[int, Any]]:
    import ray

    started = not ray.is_initialized()
    if started:
        if fanout.ray_address:
            ray.init(address=fanout.ray_address, logging_level="WARNING",
                     runtime_env={"py_modules": [str(ROOT / "anchorage"), str(ROOT / "bench")],
                                  "excludes": ["results/", "__pycache__/"]})
        else:
            ray.init(num_cpus=fanout.workers, include_dashboard=False,
                     _node_ip_address="127.0.0.1", logging_level="WARNING")
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(importable(fn))
        index = {task.remote(job): i for i, job in enumerate(jobs)}
        pending = list(index)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield index[ref], ray.get(ref)
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------
# Run cache

class RunCache:
    """Finished runs (job -> result) in a JSON-lines file, appended as they finish; a job
    is keyed by its JSON text (a tuple and the list read back are the same job). With no
    path it only remembers runs of this process."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path else None
        self._rows: dict[str, Any] = {}
        if self.path is not None and self.path.exists():
            for n, line in enumerate(self.path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    self._rows[self.key(d["job"])] = d["row"]
                except (ValueError, KeyError, TypeError) as exc:
                    raise SystemExit(f"{self.path}:{n}: not a run-cache line ({exc})") from None

    @staticmethod
    def key(job: Any) -> str:
        return json.dumps(job)

    def __contains__(self, job: Any) -> bool:
        return self.key(job) in self._rows

    def __getitem__(self, job: Any) -> Any:
        return self._rows[self.key(job)]

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, job: Any, row: Any) -> None:
        self._rows[self.key(job)] = row
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"job": job, "row": row}) + "\n")


def merge_latest(items: Iterable[dict], key: Callable[[dict], Any]) -> list[dict]:
    """One item per key, in the order keys first appear; a later item replaces an earlier
    one with the same key (``--merge`` of result files: the later file wins)."""
    by: dict[Any, dict] = {}
    for it in items:
        by[key(it)] = it
    return list(by.values())


def replace_rows(rows: list[dict], new: list[dict], key: Callable[[dict], Any]) -> list[dict]:
    """``rows`` without those whose key is among ``new``'s, then ``new`` (a re-run of a
    setting replaces its rows in a results file that accumulates settings)."""
    keys = {key(r) for r in new}
    return [r for r in rows if key(r) not in keys] + new


# ---------------------------------------------------------------------------------------
# Output

def table(columns: Sequence[Column], rows: Sequence[Any], **kw: Any) -> str:
    return format_table(columns, rows, **kw)


def git_state() -> dict:
    """The commit measured, and the files of the code under test that differ from it."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT,
                                  check=False).stdout.strip()
        except OSError:
            return ""

    return {"head": git("rev-parse", "HEAD"),
            "modified": git("status", "--porcelain", "--", "anchorage", "bench/*.py",
                            "node_agent", "router").splitlines()}


def command() -> str:
    """The command line that ran this process, as ``python -m <module> <args>``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else ["python", sys.argv[0]]
    return shlex.join(head + sys.argv[1:])


def meta() -> dict:
    git = git_state()
    return {"command": command(), "commit": git["head"], "modified": git["modified"],
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith(("BENCH_", "ANCHORAGE_"))},
            "machine": machine_description(), "host": platform.node(),
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become None, mapping keys strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k if isinstance(k, str) else str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def write_json(path: str | Path, doc: dict, *, with_meta: bool = True) -> Path:
    """Write a result file (``doc`` plus ``meta``, see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if with_meta:
        doc = {**doc, "meta": meta()}
    path.write_text(json.dumps(clean(doc), indent=1, default=str) + "\n")
    return path


# -- a private network namespace --------------------------------------------------------
NETNS_ENV = "ANCHORAGE_BENCH_NETNS"


def in_netns() -> bool:
    """True inside the namespace ``reexec_in_netns`` made."""
    return os.environ.get(NETNS_ENV) == "1"


def reexec_in_netns(module: str, argv: Sequence[str], needs: Sequence[str] = ("unshare",),
                    missing: str = "needs root and unshare (a private network namespace)"
                    ) -> int:
    """Run ``python -m module argv`` again in a private network namespace whose only
    interface is loopback (``unshare -n``, as root), with its own HOME and Ray's usage
    stats off; returns its exit status, 2 (saying ``missing``) without root or a tool."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in needs):
        print(missing, file=sys.stderr)
        return 2
    home = tempfile.mkdtemp(prefix="anchorage-bench-home-")
    inner = shlex.join([sys.executable, "-m", module, *argv])
    return subprocess.call(["unshare", "-n", "--", "sh", "-c", f"ip link set lo up && exec {inner}"],
                           env=dict(os.environ, **{NETNS_ENV: "1"}, HOME=home,
                                    RAY_USAGE_STATS_ENABLED="0"), cwd=ROOT)
