"""Summaries of one or more replays: a plain-text table, markdown and PNG plots.

``summarize(results, wall_s, engine_delta)`` ->
``{"requests", "ok", "failed", "errors" (first 5), "hit_rate_usage" (sum cached_tokens / sum
prompt_tokens from usage.prompt_tokens_details), "hit_rate_engines" (vLLM's own
counters over the run, warm-ups included: (prefix_cache hits + external_prefix_cache hits,
i.e. tokens from the device cache or a host tier) / prefix_cache queries; None without
engine URLs),
"prompt_tokens", "cached_tokens", "recomputed_prefill_tokens" (prompt - cached),
"ttft_p50_s", "ttft_p90_s", "latency_p50_s", "turns_per_s" (successful requests / wall),
"wall_s"}``. Percentiles are nearest-rank over successful requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anchorage.drive.replay import Result
from anchorage.percentile import percentile

FIELDS = [  # (key, label, format)
    ("requests", "requests", "{:d}"), ("failed", "failed", "{:d}"),
    ("hit_rate_usage", "hit rate (usage)", "{:.3f}"),
    ("hit_rate_engines", "hit rate (vLLM counters)", "{:.3f}"),
    ("recomputed_prefill_tokens", "recomputed prefill tokens", "{:,d}"),
    ("ttft_p50_s", "TTFT p50 (ms)", "ms"), ("ttft_p90_s", "TTFT p90 (ms)", "ms"),
    ("turns_per_s", "turns/s", "{:.2f}"), ("wall_s", "wall (s)", "{:.1f}"),
    ("cpu_s", "CPU of the stack (s)", "{:.1f}"), ("cpu_ms_per_turn", "CPU per turn (ms)", "{:.0f}"),
    ("node_agents.policy_errors", "policy errors (node agents)", "{:,.0f}"),
    ("node_agents.warmups_issued", "warm-ups issued", "{:,.0f}"),
    ("node_agents.warmups_used", "warm-ups used", "{:,.0f}"),
]


def _get(summary: dict[str, Any], key: str) -> Any:
    """``a.b`` reads a nested field; missing -> None."""
    cur: Any = summary
    for part in key.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def _percentile(xs: list[float], q: float) -> float | None:
    """``anchorage.percentile`` (q in [0, 100]); None (JSON null) for no values."""
    return percentile(xs, q) if xs else None


def summarize(results: list[Result], wall_s: float, engines: dict[str, float] | None = None
              ) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    errs = [f"#{r.index} {r.error}" for r in results if not r.ok][:5]
    counters = engines or {}
    q = counters.get("queries") or 0
    return {
        "requests": len(results), "ok": len(ok), "failed": len(results) - len(ok), "errors": errs,
        "hit_rate_usage": cached / prompt if prompt else 0.0,
        "hit_rate_engines": ((counters.get("hits", 0.0) + counters.get("external_hits", 0.0))
                             / q) if q else None,
        "prompt_tokens": prompt, "cached_tokens": cached,
        "recomputed_prefill_tokens": prompt - cached,
        "ttft_p50_s": _percentile(ttfts, 50), "ttft_p90_s": _percentile(ttfts, 90),
        "latency_p50_s": _percentile([r.latency_s for r in ok], 50),
        "turns_per_s": len(ok) / wall_s if wall_s > 0 else 0.0, "wall_s": wall_s,
        "engine_counters": engines,
    }


def cpu_summary(cpu: dict[str, dict[str, float]], summary: dict[str, Any]) -> dict[str, Any]:
    """The stack's CPU over a run (``supervisor.cpu_used``: per child, per process name):
    its total, per successful turn, and the router's share (the engines' API servers,
    engine cores and workers are the rest, with the node agents)."""
    total = sum(sum(per.values()) for per in cpu.values())
    ok = summary.get("ok") or 0
    return {"cpu_s": round(total, 2),
            "cpu_ms_per_turn": total * 1000 / ok if ok else None,
            "cpu_router_s": round(sum(cpu.get("router", {}).values()), 2)}


def format_value(value: Any, fmt: str) -> str:
    """One figure as the tables print it (``fmt``: a format string, or ``ms`` for seconds
    shown as milliseconds); None is ``-``."""
    if value is None:
        return "-"
    if fmt == "ms":
        return f"{value * 1000:.0f}"
    return fmt.format(value)


def table(summaries: dict[str, dict[str, Any]]) -> str:
    names = list(summaries)
    rows = [["", *names]] + [[label, *(format_value(_get(summaries[n], k), f) for n in names)]
                             for k, label, f in FIELDS
                             if any(_get(summaries[n], k) is not None for n in names)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                       for i, c in enumerate(r)) for r in rows]
    return "\n".join(lines)


def markdown(summaries: dict[str, dict[str, Any]], title: str = "Anchorage drive",
             plots: list[str] | None = None, notes: list[str] | None = None) -> str:
    names = list(summaries)
    out = [f"# {title}", "", "| | " + " | ".join(names) + " |",
           "|---|" + "---:|" * len(names)]
    for k, label, f in FIELDS:
        if any(_get(summaries[n], k) is not None for n in names):
            out.append(f"| {label} | " + " | ".join(format_value(_get(summaries[n], k), f)
                                                    for n in names) + " |")
    for n in names:
        if summaries[n]["errors"]:
            out += ["", f"First errors ({n}):", ""] + [f"- `{e}`" for e in summaries[n]["errors"]]
    if notes:
        out += [""] + notes
    for p in plots or []:
        out += ["", f"![{Path(p).stem}]({Path(p).name})"]
    return "\n".join(out) + "\n"


def plots(summaries: dict[str, dict[str, Any]], runs: dict[str, list[Result]], out_dir: Path
          ) -> list[str]:
    """Bar charts of the headline figures and the hit rate over time; returns PNG paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(summaries)
    paths = []
    panels = [("hit_rate_usage", "prefix-cache hit rate", 1.0),
              ("recomputed_prefill_tokens", "recomputed prefill tokens", 1.0),
              ("ttft_p50_s", "TTFT p50 (ms)", 1000.0), ("ttft_p90_s", "TTFT p90 (ms)", 1000.0),
              ("turns_per_s", "turns/s", 1.0)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2))
    colors = ["#8c8c8c", "#1f77b4", "#ff7f0e", "#2ca02c"]
    for ax, (k, label, scale) in zip(axes, panels):
        vals = [(summaries[n].get(k) or 0) * scale for n in names]
        ax.bar(range(len(names)), vals, color=colors[:len(names)])
        ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    p = out_dir / "summary.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for n in names:
        rs = sorted((r for r in runs.get(n, []) if r.ok), key=lambda r: r.sent_s)
        xs, ys, p_sum, c_sum = [], [], 0, 0
        for i, r in enumerate(rs, 1):
            p_sum += r.prompt_tokens
            c_sum += r.cached_tokens
            xs.append(i)
            ys.append(c_sum / p_sum if p_sum else 0.0)
        ax.plot(xs, ys, label=n)
    ax.set_xlabel("requests sent")
    ax.set_ylabel("cumulative hit rate (tokens)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out_dir / "hit_rate_over_time.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(str(p))
    return paths


def write(out_dir: Path, summaries: dict[str, dict[str, Any]], runs: dict[str, list[Result]],
          title: str, notes: list[str] | None = None, extra: dict | None = None) -> dict[str, str]:
    """report.md, report.json, results-<name>.jsonl and the plots into ``out_dir``."""
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plots(summaries, runs, out_dir)
    (out_dir / "report.md").write_text(markdown(summaries, title, pngs, notes))
    (out_dir / "report.json").write_text(json.dumps(
        {"summaries": summaries, **(extra or {})}, indent=1, default=str))
    for n, rs in runs.items():
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in n)
        with open(out_dir / f"results-{safe}.jsonl", "w") as fh:
            for r in rs:
                fh.write(json.dumps(r.to_dict()) + "\n")
    return {"markdown": str(out_dir / "report.md"), "json": str(out_dir / "report.json"),
            "plots": ", ".join(pngs)}
