"""Cost of the node agent's state hand-off inside the engine process.

- ``observe_us``: CPU microseconds per real request for ``NodeState.observe`` (anchor
  registry, prediction check, access-log ring), the only part on the request path;
- ``snapshot_ms``: CPU milliseconds per ``PolicyStateExporter.write_once`` (policy view,
  JSON, atomic write), done by a daemon thread every ``interval_s`` (0.5 s by default).

Workload: ``--agents`` agents with ``--anchor-tokens``-token anchors, ``--sessions``
sessions cycling through them, prompts of anchor + ``--private-tokens``, block size 16,
the ``hybrid`` policy fed the same requests (its own cost is not counted). CPU time
(``time.process_time``), best of ``--repeat``.

    .venv/bin/python -m bench.bench_node_state [--out bench/results/node_state.json]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import tempfile
import time
from pathlib import Path

from anchorage.node_agent.state import NodeState, PolicyStateExporter, write_settings
from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from bench import harness

BS = 16
GROUP0 = (0).to_bytes(4, "big")


def block_keys(tokens: list[int]) -> list[bytes]:
    out, prev = [], b""
    for i in range(len(tokens) // BS):
        prev = hashlib.sha256(prev + repr(tokens[i * BS:(i + 1) * BS]).encode()).digest()
        out.append(prev + GROUP0)
    return out


def run(args) -> dict:
    rng = random.Random(1)
    anchors = [[rng.randrange(32000) for _ in range(args.anchor_tokens)]
               for _ in range(args.agents)]
    reqs = []
    for i in range(args.requests):
        toks = anchors[i % args.agents] + [rng.randrange(32000) for _ in range(args.private_tokens)]
        reqs.append((toks, block_keys(toks), f"s{i % args.sessions}"))
    best_obs, best_snap, size = float("inf"), float("inf"), 0
    for _ in range(args.repeat):
        policy = make_policy("hybrid", block_size=BS)
        state = NodeState(BS)
        state.predictability = 1.0  # gate open: the prediction check runs every time
        spent = 0.0
        for i, (toks, keys, sid) in enumerate(reqs):
            ctx = RequestContext(request_id=i, keys=keys, input_length=len(toks),
                                 now_s=i * 0.1, session_id=sid)
            policy.on_request(ctx)
            t0 = time.process_time()
            state.observe(policy, ctx, toks)
            spent += time.process_time() - t0
            policy.on_request_done(ctx)
        best_obs = min(best_obs, spent / len(reqs) * 1e6)
        with tempfile.TemporaryDirectory() as d:
            write_settings(d, access_log_sample_rate=args.sample_rate)
            exp = PolicyStateExporter(policy, Path(d) / "state.json", node_state=state)
            t0 = time.process_time()
            for _ in range(20):
                exp.write_once()
            best_snap = min(best_snap, (time.process_time() - t0) / 20 * 1e3)
            size = (Path(d) / "state.json").stat().st_size
    return {"agents": args.agents, "anchor_tokens": args.anchor_tokens,
            "private_tokens": args.private_tokens, "sessions": args.sessions,
            "requests": args.requests, "sample_rate": args.sample_rate,
            "observe_us": round(best_obs, 2), "snapshot_ms": round(best_snap, 3),
            "snapshot_bytes": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--anchor-tokens", type=int, default=1024)
    p.add_argument("--private-tokens", type=int, default=1024)
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--sample-rate", type=float, default=0.05)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default="bench/results/node_state.json")
    args = p.parse_args()
    res = run(args)
    print(f"{'observe us/request':>20} {'snapshot ms':>12} {'snapshot bytes':>15}")
    print(f"{res['observe_us']:>20.2f} {res['snapshot_ms']:>12.3f} {res['snapshot_bytes']:>15}")
    harness.write_json(args.out, res)


if __name__ == "__main__":
    main()
