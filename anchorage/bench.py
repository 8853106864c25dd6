"""Benchmark suite: policies x workloads x capacities through sequential replay.

Capacities are fractions of each workload's unique blocks, plus (optionally) the
"half-LRU" capacity: the smallest capacity at which LRU reaches half the infinite-cache
hit rate, where the issue's gap-closing targets are measured. Every row carries LRU and
Belady measured in the same run, so ratios are against baselines of the same run.
"""

from __future__ import annotations

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
    pol = make_policy(policy, block_size=wl.block_size, contexts=wl.contexts, params=params)
    res = replay(wl.contexts, capacity, wl.block_size, pol)
    out = res.to_json()
    out["policy"] = policy
    return out


def half_lru_capacity(wl: Workload, lo_frac: float = 0.001, hi_frac: float = 1.0,
                      iters: int = 12) -> int:
    """Smallest capacity (binary search) where LRU gets half the infinite-cache hit rate."""
    target = wl.infinite_hit_rate / 2
    lo = max(1, int(wl.unique_blocks * lo_frac))
    hi = max(lo + 1, int(wl.unique_blocks * hi_frac))
    for _ in range(iters):
        if hi - lo <= max(1, lo // 100):
            break
        mid = (lo + hi) // 2
        if run_one(wl, mid, "lru")["hit_rate"] >= target:
            hi = mid
        else:
            lo = mid
    return hi


def run_suite(workloads: Sequence[Workload], policies: Sequence[str],
              fracs: Sequence[float] = DEFAULT_FRACS, *, half_lru: bool = True,
              log: Callable[[str], None] | None = None) -> list[Row]:
    rows: list[Row] = []
    for wl in workloads:
        caps: list[tuple[str, int]] = [
            (f"{f:.0%}", max(1, round(wl.unique_blocks * f))) for f in fracs]
        if half_lru:
            caps.append(("half-LRU", half_lru_capacity(wl)))
        for label, cap in caps:
            row = Row(wl.name, label, cap, cap / max(1, wl.unique_blocks), wl.infinite_hit_rate)
            for p in policies:
                t0 = time.perf_counter()
                row.results[p] = run_one(wl, cap, p)
                if log:
                    log(f"{wl.name:<28} {label:>8} {p:<16} hit {row.results[p]['hit_rate']:.2%}"
                        f"  ({time.perf_counter() - t0:.1f}s)")
            rows.append(row)
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


def format_rows(rows: Sequence[Row], policies: Sequence[str], markdown: bool = False) -> str:
    """One table: hit rate per policy at each capacity, plus LRU-to-Belady gap closed."""
    cols = ["workload", "capacity", "blocks", "infinite"] + list(policies)
    has_gap = "lru" in policies and "belady" in policies
    others = [p for p in policies if p not in ("lru", "belady")]
    if has_gap:
        cols += [f"{p} gap closed" for p in others]
    lines = []
    if markdown:
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
    else:
        lines.append("  ".join(f"{c:>14}" if i > 1 else f"{c:<26}" if i == 0 else f"{c:>9}"
                               for i, c in enumerate(cols)))
    for r in rows:
        vals = [r.workload, r.capacity_label, str(r.capacity_blocks),
                f"{r.infinite_hit_rate:.1%}"]
        vals += [f"{r.results[p]['hit_rate']:.1%}" for p in policies]
        if has_gap:
            lru, bel = r.results["lru"]["hit_rate"], r.results["belady"]["hit_rate"]
            for p in others:
                gap = bel - lru
                vals.append(f"{(r.results[p]['hit_rate'] - lru) / gap:.0%}" if gap > 1e-9 else "n/a")
        if markdown:
            lines.append("| " + " | ".join(vals) + " |")
        else:
            lines.append("  ".join(f"{v:>14}" if i > 1 else f"{v:<26}" if i == 0 else f"{v:>9}"
                                   for i, v in enumerate(vals)))
    return "\n".join(lines)


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
