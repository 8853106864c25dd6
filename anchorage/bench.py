"""Benchmark suite: policies x workloads x capacities through sequential replay.

The one implementation of the eviction-policy sweep, used by `anchorage bench` and by
``bench/bench_policies.py`` / ``bench/bench_foundation.py``:

- ``fraction_capacities(wl, fracs)``: capacities as fractions of the workload's unique
  blocks, labelled ``1%``, ``5%``, ...;
- ``half_lru_capacity(wl, search)``: the "half-LRU" capacity, the smallest capacity at
  which LRU reaches half the infinite-cache hit rate (bisection, ``HalfLRUSearch``), where
  the gap-closing targets are measured;
- ``sweep(wl, capacities, policies)``: one ``Row`` per capacity, every policy replayed
  from an empty pool (``run_one``). Every row carries LRU and Belady measured in the same
  run when they are among the policies, so ratios are against baselines of the same run;
- ``format_table(columns, rows)``: the one table printer of the benchmarks (terminal or
  markdown), and ``format_rows`` the suite's table built on it;
- ``machine_description()``: CPU, cores, Python, OS, for the results' metadata.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.sim.replay import infinite_hit_rate, make_contexts, replay
from anchorage.trace.format import TraceHeader, TraceRecord

DEFAULT_FRACS = (0.01, 0.02, 0.05, 0.10, 0.20)


@dataclass
class Workload:
    name: str
    block_size: int
    contexts: list[RequestContext]
    source: str = ""
    unique_blocks: int = 0
    infinite_hit_rate: float = 0.0

    @classmethod
    def from_records(cls, name: str, header: TraceHeader, records: Sequence[TraceRecord],
                     source: str = "") -> "Workload":
        ctxs = make_contexts(records)
        wl = cls(name=name, block_size=header.block_size, contexts=ctxs, source=source)
        wl.unique_blocks = len({k for c in ctxs for k in c.keys})
        wl.infinite_hit_rate = infinite_hit_rate(ctxs, header.block_size)
        return wl


@dataclass
class Row:
    workload: str
    capacity_label: str
    capacity_blocks: int
    capacity_frac: float
    infinite_hit_rate: float
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "capacity": self.capacity_label,
                "capacity_blocks": self.capacity_blocks, "capacity_frac": self.capacity_frac,
                "infinite_hit_rate": self.infinite_hit_rate, "results": self.results}


def run_one(wl: Workload, capacity: int, policy: str,
            params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One replay from an empty pool: ``ReplayResult.to_json()`` plus ``policy`` and the
    policy's ``state_bytes`` after the replay."""
    pol = make_policy(policy, block_size=wl.block_size, contexts=wl.contexts, params=params)
    res = replay(wl.contexts, capacity, wl.block_size, pol)
    out = res.to_json()
    out["policy"] = policy
    out["state_bytes"] = pol.state_size_bytes()
    return out


@dataclass(frozen=True)
class HalfLRUSearch:
    """Bisection for the half-LRU capacity over [lo, unique blocks]: ``lo`` = max(1,
    int(unique x ``lo_frac``)); at most ``iters`` halvings, stopping early once
    hi - lo <= max(1, lo // ``stop_lo_div``) (when set) or <= max(1, unique //
    ``stop_unique_div``) (when set). The answer is the upper end, a capacity where LRU
    gets at least half the infinite-cache rate. The defaults are `anchorage bench`'s;
    ``bench/bench_policies.py`` keeps its own committed setting."""

    lo_frac: float = 0.001
    iters: int = 12
    stop_lo_div: int | None = 100
    stop_unique_div: int | None = None

    def done(self, lo: int, hi: int, unique: int) -> bool:
        if self.stop_lo_div is not None and hi - lo <= max(1, lo // self.stop_lo_div):
            return True
        return self.stop_unique_div is not None and hi - lo <= max(1, unique // self.stop_unique_div)


def half_lru_capacity(wl: Workload, search: HalfLRUSearch = HalfLRUSearch()) -> int:
    """Smallest capacity (binary search) where LRU gets half the infinite-cache hit rate."""
    target = wl.infinite_hit_rate / 2
    lo = max(1, int(wl.unique_blocks * search.lo_frac))
    hi = max(lo + 1, wl.unique_blocks)
    for _ in range(search.iters):
        if search.done(lo, hi, wl.unique_blocks):
            break
        mid = (lo + hi) // 2
        if run_one(wl, mid, "lru")["hit_rate"] >= target:
            hi = mid
        else:
            lo = mid
    return hi


def fraction_capacities(wl: Workload, fracs: Sequence[float]) -> list[tuple[str, int]]:
    """(label, blocks) per fraction of the unique blocks: ``5%`` -> round(unique x 0.05)."""
    return [(f"{f:.0%}", max(1, round(wl.unique_blocks * f))) for f in fracs]


def sweep(wl: Workload, capacities: Sequence[tuple[str, int]], policies: Sequence[str],
          log: Callable[[str], None] | None = None) -> list[Row]:
    """Every policy at every (label, blocks) capacity of one workload."""
    rows = []
    for label, cap in capacities:
        row = Row(wl.name, label, cap, cap / max(1, wl.unique_blocks), wl.infinite_hit_rate)
        for p in policies:
            t0 = time.perf_counter()
            row.results[p] = run_one(wl, cap, p)
            if log:
                log(f"{wl.name:<28} {label:>8} {p:<16} hit {row.results[p]['hit_rate']:.2%}"
                    f"  ({time.perf_counter() - t0:.1f}s)")
        rows.append(row)
    return rows


def run_suite(workloads: Sequence[Workload], policies: Sequence[str],
              fracs: Sequence[float] = DEFAULT_FRACS, *, half_lru: bool = True,
              log: Callable[[str], None] | None = None) -> list[Row]:
    rows: list[Row] = []
    for wl in workloads:
        caps = fraction_capacities(wl, fracs)
        if half_lru:
            caps.append(("half-LRU", half_lru_capacity(wl)))
        rows += sweep(wl, caps, policies, log)
    return rows


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()} "
            f"({platform.python_implementation()}), {platform.system()} {platform.release()}")


# ---------------------------------------------------------------------------------------
# Tables

@dataclass(frozen=True)
class Column:
    """One column: ``value`` is a row key or a function of the row, shown with the format
    spec ``fmt`` (``missing`` for None or NaN), right-aligned in ``width`` characters
    unless ``align`` is ``<`` (terminal tables; 0 = as wide as the widest cell)."""

    header: str
    value: str | Callable[[Any], Any]
    fmt: str = ""
    width: int = 0
    align: str = ">"
    missing: str = "-"

    def cell(self, row: Any) -> str:
        v = row[self.value] if isinstance(self.value, str) else self.value(row)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return self.missing
        return format(v, self.fmt)


def format_table(columns: Sequence[Column], rows: Sequence[Any], *, markdown: bool = False,
                 sep: str = "  ", rule: bool = False) -> str:
    """The rows as a table: markdown (``| a | b |``), or aligned text columns joined by
    ``sep``, trailing blanks dropped (``rule``: a dashed line under the header)."""
    cells = [[c.cell(r) for c in columns] for r in rows]
    heads = [c.header for c in columns]
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(vals) + " |" for vals in cells])
    widths = [c.width or max([len(h)] + [len(v[i]) for v in cells])
              for i, (c, h) in enumerate(zip(columns, heads))]

    def line(vals: Sequence[str]) -> str:
        return sep.join(format(v, f"{c.align}{w}") for c, w, v in zip(columns, widths, vals)
                        ).rstrip()

    head = line(heads)
    out = [head] + (["-" * len(head)] if rule else [])
    return "\n".join(out + [line(v) for v in cells])


def format_rows(rows: Sequence[Row], policies: Sequence[str], markdown: bool = False) -> str:
    """One table: hit rate per policy at each capacity, plus LRU-to-Belady gap closed."""
    def hit(p: str) -> Callable[[Row], float]:
        return lambda r: r.results[p]["hit_rate"]

    def gap_closed(p: str) -> Callable[[Row], str]:
        def f(r: Row) -> str:
            lru, bel = r.results["lru"]["hit_rate"], r.results["belady"]["hit_rate"]
            gap = bel - lru
            return f"{(r.results[p]['hit_rate'] - lru) / gap:.0%}" if gap > 1e-9 else "n/a"
        return f

    cols = [Column("workload", lambda r: r.workload, width=26, align="<"),
            Column("capacity", lambda r: r.capacity_label, width=9),
            Column("blocks", lambda r: r.capacity_blocks, width=14),
            Column("infinite", lambda r: r.infinite_hit_rate, ".1%", width=14)]
    cols += [Column(p, hit(p), ".1%", width=14) for p in policies]
    if "lru" in policies and "belady" in policies:
        cols += [Column(f"{p} gap closed", gap_closed(p), width=14)
                 for p in policies if p not in ("lru", "belady")]
    return format_table(cols, rows, markdown=markdown)


def plot_rows(rows: Sequence[Row], policies: Sequence[str], out_dir: str | Path) -> list[Path]:
    """PNG per workload: hit rate vs capacity, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    by_wl: dict[str, list[Row]] = {}
    for r in rows:
        by_wl.setdefault(r.workload, []).append(r)
    for wl, rs in by_wl.items():
        rs = sorted(rs, key=lambda r: r.capacity_blocks)
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r.capacity_frac * 100 for r in rs]
        for p in policies:
            ax.plot(xs, [r.results[p]["hit_rate"] * 100 for r in rs], marker="o", label=p,
                    linestyle="--" if p == "belady" else "-")
        ax.axhline(rs[0].infinite_hit_rate * 100, color="grey", linestyle=":",
                   label="infinite cache")
        ax.set_xscale("log")
        ax.set_xlabel("capacity (% of unique blocks)")
        ax.set_ylabel("block hit rate (%)")
        ax.set_title(wl)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = out / f"hit_rate_{wl.replace('/', '_').replace(':', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
