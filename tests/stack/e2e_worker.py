"""Runs inside a private network namespace (``unshare -n``, loopback up), started by
``test_stack_e2e``: for each configuration, starts ``anchorage up`` exactly as a user would
(a child process), waits for its ready file, drives a short multi-agent workload through
the router, reads Prometheus' view, sends SIGINT (Ctrl-C) and checks that every process
the stack had started is gone. Writes the findings as JSON for the test to assert on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CONFIGS = [("stock", "off", "round_robin", ()), ("anchorage", "hybrid", "agent", ()),
           # the engines as the fleet benchmark's Anchorage runs them: prefix-aware admission,
           # a host-memory KV tier the engines read one another's of, and the prefill chunk
           # cap (the chart's scheduler, hostTier with nodePool, and longPrefillTokens)
           # and the small model (--tiny-size small: prefill most of a TTFT)
           ("anchorage-full", "hybrid", "agent",
            ("--scheduler", "prefix-aware", "--host-tier-mb", "16", "--node-pool",
             "--long-prefill-tokens", "64", "--tiny-size", "small"))]
# what vLLM itself logs at start: the scheduler class it built, the connector it loaded,
# the prefill chunk cap among its non-default arguments
ENGINE_LOG_LINES = ("PrefixAwareScheduler", "AnchorageOffloadingConnector",
                    "'long_prefill_token_threshold': 64")


def prometheus_targets_up(url: str) -> int:
    q = url + "/api/v1/query?query=up"
    with urllib.request.urlopen(q, timeout=10) as r:  # noqa: S310 - loopback
        data = json.loads(r.read())
    return sum(1 for s in data["data"]["result"] if s["value"][1] == "1")


def one(name: str, policy: str, router: str, flags, work: Path, wl, sessions_opts) -> dict:
    from anchorage.drive.plan import PlanOptions
    from anchorage.drive.run import drive
    from anchorage.stack.supervisor import alive, descendants
    from tests.support.procs import comm

    ready = work / f"{name}-ready.json"
    log = open(work / f"{name}-up.log", "w")
    # a user's shell: not the test command's VLLM_ENABLE_V1_MULTIPROCESSING=0
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    up = subprocess.Popen([sys.executable, "-m", "anchorage.cli", "up", "--policy", policy,
                           "--router", router, "--ready-file", str(ready),
                           "--workdir", str(work / name), *flags],
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    out: dict = {"name": name}
    try:
        deadline = time.time() + 420
        while not ready.exists():
            if up.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"anchorage up ({name}) did not get ready:\n"
                                   + (work / f"{name}-up.log").read_text()[-3000:])
            time.sleep(0.5)
        ep = json.loads(ready.read_text())
        tree = descendants(up.pid)
        out["processes"] = len(tree)
        out["process_names"] = sorted({comm(p) for p in tree} - {""})
        summary, _ = drive(ep["router"], wl, PlanOptions(**sessions_opts), ep["engines"],
                           concurrency=6, label=name, max_sessions=8)
        out["summary"] = summary
        if ep.get("prometheus"):
            time.sleep(3)  # one scrape interval
            out["prometheus_up"] = prometheus_targets_up(ep["prometheus"])
        out["expected_targets"] = 2 * len(ep["engines"]) + 1
        logs = [p.read_text(errors="replace") for p in (work / name / "logs").glob("engine-*.log")]
        out["engine_log_lines"] = {k: sum(k in t for t in logs) for k in ENGINE_LOG_LINES}
        # the KV bytes per block of the model the engines loaded, from the host tier's
        # snapshots (the connector sizes its chunks from vLLM's KV tensors)
        out["host_chunk_bytes"] = sorted(
            json.loads(p.read_text())["chunk_bytes"]
            for p in (work / name).rglob("host_tier.json"))
        pool = work / name / "node-pool"  # the node pool's files while the engines run
        out["node_pool_files"] = sorted(os.listdir(pool)) if pool.is_dir() else []
    finally:
        t0 = time.time()
        up.send_signal(signal.SIGINT)
        try:
            out["exit_code"] = up.wait(120)
        except subprocess.TimeoutExpired:
            out["exit_code"] = "timeout"
            up.kill()
        out["stop_s"] = round(time.time() - t0, 1)
        time.sleep(1)
        out["left_behind"] = [p for p in tree if alive(p)] if "processes" in out else []
        log.close()
        out["up_log_tail"] = (work / f"{name}-up.log").read_text()[-1500:]
    return out


def main(result_path: str, work: str) -> None:
    from anchorage.drive.workload import generated

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work_p = Path(work)
    wl = generated("selector", 6, 30, 7, 32, 6.0, 400)
    opts = {"block_size": 32, "vocab": 1024, "time_compression": 50.0}
    results = {"requests": len(wl.records), "runs": []}
    try:
        for name, policy, router, flags in CONFIGS:
            results["runs"].append(one(name, policy, router, flags, work_p, wl, opts))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        import traceback
        results["error"] = f"{exc}\n{traceback.format_exc()}"
    Path(result_path).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
