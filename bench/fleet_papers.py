"""Paper reproduction: for each seed paper, the simulator's closest setting to its headline
experiment, its algorithm as published beside Anchorage's reformulation, and the paper's
claimed ratio beside the simulated one.

- ``cachewise`` (Tiwari et al., sections 6.1-6.3): one Qwen2.5-Coder-32B instance on two
  H200s (TP2; profile ``h200x2-qwen2.5-32b-tp2``), chunked prefill of 512 tokens, N = 30 /
  40 / 50 coding-agent sessions launched together and run to completion (the closed
  batch of the paper). CATraces are not public here; the real WEKA Claude Code sessions
  (122k-token prompts) are the closest. Arms, all with prefix-aware scheduling where the
  paper's ablation has it: vLLM (LRU, FCFS), vLLM (prefix-aware), InferCept
  (prefix-aware), CacheWise as published, Anchorage's ``cachewise`` and ``hybrid``
  (prefix-aware). Claims: token goodput 1.2-1.6x and session completion time 1.7-2x lower
  than vLLM (prefix-aware) (figure 15); 1.64-2x goodput, 2.7-3.5x lower completion time,
  2-2.6x fewer evictions than vLLM (figures 13-14). The WEKA sessions carry no tool
  names (2 of 2,556 requests name one), so CacheWise's predictor has no metadata there:
  ``cachewise-swe`` is the same experiment on the SWE-agent trajectories (tool names and
  arguments for every turn), their contexts (7.7k tokens) against a KV budget scaled by
  the same factor as the paper's ~100k-token contexts (687,712 tokens x 7.7k / 100k =
  3,300 16-token blocks), so N sessions fill the cache as the paper's N sessions do.
- ``cachescout`` (sections 5.1-5.3): Llama-3.1-8B on one GPU (``h200-llama3-8b``), the
  six-agent SelectorGroupChat workload (the generator's ``selector``, its own tool times:
  AutoGen's short inter-turn gaps), sessions arriving as a Poisson process at several
  rates, a KV budget of 16,384 16-token blocks (the paper's budget is not stated; with
  this one vLLM's hit rate at the lightest rates is the paper's 64-77 %). Arms: vLLM (LRU),
  Continuum's TTL (0.3 s, as the paper configures it), CacheScout as published (eq. 7-9),
  Anchorage's ``cachescout`` and ``hybrid``. Claims: +10-18 points of hit rate, mean TTFT
  -18-45 %, peak throughput +19-57 % over vLLM.
- ``tokencake`` (section 7): one replica, a DAG application (the generator's
  ``hierarchical`` topology with its MCP-like tool latencies), applications arriving as a
  Poisson process at 0.5 / 1 / 2 per second, a KV budget of 16 GiB (the paper's
  ablation runs at half the GPU memory), 100 GB of host memory over one PCIe Gen5 link;
  clients label agents (TokenCake reads the application graph). Arms: vLLM (no host
  tier; blocks freed at each turn's end, evictable), vLLM keeping each stalled agent's KV
  resident until it returns (``vllm-retain``, as the paper's vLLM baselines do: "both
  retain stalled agents' KV Caches in GPU memory"; a waiting request that does not fit
  takes the retained KV of the agent that stalled last), offload alone (every stall swapped,
  ``naive``), TokenCake as published, Anchorage's ``tokencake`` tiering. Claims: average
  latency -47 % vs vLLM at 1.0 QPS (14B Code-Writer), swap volume -51 % vs offload alone.

Every paper also has a ``limit`` arm: its baseline with HBM for every block the workload
caches (``infinite-device``, same compute), the most any eviction or tiering policy can
gain in that setting; a claim larger than the limit's own gain cannot be reproduced in the
setting, whatever the algorithm.

Usage::

    .venv/bin/python -m bench.fleet_papers [--papers cachewise,cachescout,tokencake]
        [--seeds 1,2,3] [--jobs 2] [--cache ...] [--out bench/results/fleet_papers.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from collections import defaultdict
from pathlib import Path

from anchorage.fleet.hierarchy import MemoryHierarchy
from anchorage.fleet.run import Setting, run_stack
from anchorage.fleet.spec import StackSpec, get_stack
from anchorage.sim.profiles import get_profile
from anchorage.sim.replay import make_contexts
from anchorage.tiering.host_tier import GB
from bench import fleet_workloads, harness

SRC = "bench/fleet_papers.py (paper arm)"


def _arm(name, **kw) -> StackSpec:
    base = dict(name=name, peer=name, source=SRC, role="paper", router="round_robin")
    base.update(kw)
    return StackSpec(**base)


ARMS = {
    "cachewise": {
        "vllm": _arm("vllm", policy="lru"),
        "vllm-prefix-aware": _arm("vllm-prefix-aware", policy="lru", admission="prefix-aware"),
        "infercept-prefix-aware": _arm("infercept-prefix-aware", policy="infercept",
                                       admission="prefix-aware"),
        "cachewise-paper": _arm("cachewise-paper", policy="cachewise-paper",
                                admission="prefix-aware"),
        "cachewise-anchorage": _arm("cachewise-anchorage", policy="cachewise",
                                    admission="prefix-aware"),
        "hybrid-prefix-aware": _arm("hybrid-prefix-aware", policy="hybrid",
                                    admission="prefix-aware"),
        "limit": _arm("limit", policy="lru", admission="prefix-aware",
                      limit="infinite-device"),
    },
    "cachescout": {
        "vllm": _arm("vllm", policy="lru"),
        "continuum-ttl": _arm("continuum-ttl", policy="ttl", policy_params={"ttl_s": 0.3}),
        "cachescout-paper": _arm("cachescout-paper", policy="cachescout-paper"),
        "cachescout-anchorage": _arm("cachescout-anchorage", policy="cachescout"),
        "hybrid": _arm("hybrid", policy="hybrid"),
        "limit": _arm("limit", policy="lru", limit="infinite-device"),
    },
    "tokencake": {
        "vllm": _arm("vllm", policy="lru"),
        # the paper's vLLM baselines keep a stalled agent's KV resident during its call
        "vllm-retain": _arm("vllm-retain", policy="lru", retention="continuum",
                            retention_params={"ttl_s": 1e9, "threshold_s": 1e9,
                                              "yield_to_waiting": True}),
        "offload-alone": _arm("offload-alone", policy="lru", tiering="naive"),
        "tokencake-paper": dataclasses.replace(get_stack("tokencake-paper"),
                                               router="round_robin", router_params={}),
        "tokencake-anchorage": dataclasses.replace(get_stack("tokencake-anchorage"),
                                                   router="round_robin", router_params={}),
        "limit": _arm("limit", policy="lru", limit="infinite-device"),
    },
}
ARMS["cachewise-swe"] = ARMS["cachewise"]
SWE_CAPACITY_BLOCKS = 3300   # 687,712 tokens x (7.7k / 100k) / 16: the paper's fill per session
LOADS = {"cachewise": [30, 40, 50], "cachewise-swe": [30, 40, 50],
         "cachescout": [0.1, 0.25, 0.4, 0.6], "tokencake": [0.5, 1.0, 2.0]}
CLAIMS = {
    "cachewise": "vs vLLM (prefix-aware): token goodput 1.2-1.6x, session completion "
                 "1.7-2x lower; vs vLLM: goodput 1.64-2x, completion 2.7-3.5x lower, "
                 "evictions 2-2.6x fewer",
    "cachewise-swe": "as cachewise",
    "cachescout": "vs vLLM: hit rate +10-18 points, mean TTFT -18-45 %, peak throughput "
                  "+19-57 %",
    "tokencake": "vs vLLM at 1.0 QPS: average latency -47 %; vs offload alone: swap "
                 "volume -51 %",
}


def poisson(sessions: list[list], rate: float, seed: int) -> list:
    rng = random.Random(f"arrivals:{seed}")
    out, t = [], 0.0
    for sess in sessions:
        t += rng.expovariate(rate)
        base = sess[0].timestamp
        out += [dataclasses.replace(r, timestamp=t * 1000.0 + (r.timestamp - base))
                for r in sess]
    out.sort(key=lambda r: r.timestamp)
    return out


def _by_session(recs):
    by: dict = {}
    for r in recs:
        by.setdefault(r.session_id, []).append(r)
    return list(by.values())


def workload(job):
    paper, seed, load = job["paper"], job["seed"], job["load"]
    if paper in ("cachewise", "cachewise-swe"):
        swe = paper == "cachewise-swe"
        recs, _, bs = fleet_workloads.load("swe" if swe else "weka", int(load), seed)
        prof = get_profile("h200x2-qwen2.5-32b-tp2").with_(block_size=bs,
                                                           max_num_batched_tokens=512)
        if swe:
            prof = prof.with_(capacity_blocks_override=SWE_CAPACITY_BLOCKS * 16 // bs)
        return recs, make_contexts(recs), prof, Setting(prof, 1, slots=None)
    from anchorage.trace.generate import generate
    if paper == "cachescout":
        _, recs = generate("selector", 6, 160, seed, concurrency=64.0)
        recs = poisson(_by_session(recs), load, seed)
        prof = get_profile("h200-llama3-8b").with_(capacity_blocks_override=16384)
        return recs, make_contexts(recs), prof, Setting(prof, 1, slots=None)
    _, recs = generate("hierarchical", 6, 80, seed, concurrency=64.0)
    recs = poisson(_by_session(recs), load, seed)
    prof = get_profile("h200-llama3-8b")
    prof = prof.with_(capacity_blocks_override=int(16 * 1024 ** 3 // prof.kv_bytes_per_block))
    ctxs = make_contexts(recs)
    for c, r in zip(ctxs, recs):
        c.agent_hint = r.agent
    hier = MemoryHierarchy(host_bytes_per_gpu=100 * GB)
    return recs, ctxs, prof, Setting(prof, 1, slots=None, hierarchy=hier)


def one_run(job: dict) -> dict:
    try:
        recs, ctxs, prof, st = workload(job)
        spec = ARMS[job["paper"]][job["arm"]]
        params = None
        if spec.policy == "cachewise-paper":  # the paper trains clusters offline
            params = {"warm_start": [(r.tool_name, r.tool_args) for r in recs if r.tool_name]}
        res = run_stack(spec, recs, ctxs, st, policy_params=params)
        span = max(res["window_s"][1] - res["window_s"][0], 1e-9)
        res["token_goodput"] = sum(r.output_length for r in recs) / span
    except Exception as exc:
        return {**job, "error": f"{type(exc).__name__}: {exc}"}
    return {**job, **res}


def compare(rows: list[dict]) -> dict:
    """Per paper, per load: each arm's seed-mean metrics and the ratios the paper claims."""
    by = defaultdict(list)
    for r in rows:
        if "error" not in r:
            by[(r["paper"], r["load"], r["arm"])].append(r)

    def mean(rs, k):
        v = [r[k] for r in rs if r.get(k) is not None]
        return sum(v) / len(v) if v else None

    keys = ("token_goodput", "session_service_mean_s", "session_time_mean_s", "evictions",
            "gpu_hit_rate", "host_hit_rate", "ttft_mean_s", "turns_per_s_per_gpu",
            "host_link_bytes", "preemptions")
    out: dict = {}
    for (paper, load, arm), rs in sorted(by.items()):
        out.setdefault(paper, {}).setdefault(str(load), {})[arm] = {k: mean(rs, k) for k in keys}
    return out


# (paper, arm, baseline, metric, "higher" or "lower" is better, the paper's claim);
# the ``limit`` rows: what no policy can exceed in the setting
_CACHEWISE = [
    ("cachewise-paper", "vllm-prefix-aware", "token_goodput", "higher", "1.2-1.6x"),
    ("cachewise-paper", "vllm-prefix-aware", "session_service_mean_s", "lower",
     "1.7-2x lower"),
    ("cachewise-paper", "vllm", "token_goodput", "higher", "1.64-2x"),
    ("cachewise-paper", "vllm", "session_service_mean_s", "lower",
     "2.7-3.5x lower"),
    ("cachewise-paper", "vllm", "evictions", "lower", "2-2.6x fewer"),
    ("cachewise-anchorage", "vllm-prefix-aware", "token_goodput", "higher", "-"),
    ("vllm-prefix-aware", "vllm", "token_goodput", "higher", "1.38-1.7x"),
    ("limit", "vllm-prefix-aware", "token_goodput", "higher", "bound"),
    ("limit", "vllm-prefix-aware", "session_service_mean_s", "lower", "bound"),
]
RATIOS = [(paper, *row) for paper in ("cachewise", "cachewise-swe") for row in _CACHEWISE] + [
    ("cachescout", "cachescout-paper", "vllm", "gpu_hit_rate", "points", "+10-18 points"),
    ("cachescout", "cachescout-paper", "vllm", "ttft_mean_s", "lower", "-18-45 %"),
    ("cachescout", "cachescout-paper", "vllm", "turns_per_s_per_gpu", "higher",
     "+19-57 % (peak)"),
    ("cachescout", "cachescout-anchorage", "vllm", "gpu_hit_rate", "points", "-"),
    ("cachescout", "hybrid", "vllm", "gpu_hit_rate", "points", "-"),
    ("cachescout", "limit", "vllm", "gpu_hit_rate", "points", "bound"),
    ("cachescout", "limit", "vllm", "ttft_mean_s", "lower", "bound"),
    ("tokencake", "tokencake-paper", "vllm-retain", "session_time_mean_s", "lower",
     "-47 % (1.0 QPS)"),
    ("tokencake", "tokencake-paper", "vllm", "session_time_mean_s", "lower", "-47 % (1.0 QPS)"),
    ("tokencake", "tokencake-paper", "offload-alone", "host_link_bytes", "lower", "-51 %"),
    ("tokencake", "tokencake-anchorage", "vllm", "session_time_mean_s", "lower", "-"),
    ("tokencake", "tokencake-anchorage", "offload-alone", "host_link_bytes", "lower", "-"),
    ("tokencake", "limit", "vllm", "session_time_mean_s", "lower", "bound"),
]


def ratio_text(a: float | None, b: float | None, kind: str) -> str:
    if a is None or b is None:
        return "-"
    if kind == "points":
        return f"{100 * (a - b):+.1f} points"
    if b == 0:
        return "-"
    if kind == "higher":
        return f"{a / b:.2f}x"
    return f"{(a - b) / b:+.1%}"


def markdown(summary: dict) -> str:
    lines = ["| paper | arm vs baseline | metric | load | simulated | paper's claim |",
             "|---|---|---|---|---|---|"]
    for paper, arm, base, metric, kind, claim in RATIOS:
        for load, arms in summary.get(paper, {}).items():
            a, b = arms.get(arm, {}).get(metric), arms.get(base, {}).get(metric)
            lines.append(f"| {paper} | {arm} vs {base} | {metric} | {load} | "
                         f"{ratio_text(a, b, kind)} | {claim} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--papers", default="cachewise,cachewise-swe,cachescout,tokencake")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--loads", default=None, help="comma-separated, for every paper")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", default=str(harness.RESULTS / "fleet_papers.json"))
    harness.add_fanout_args(ap)
    args = ap.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")] if args.loads else None
    jobs = [{"paper": p, "arm": a, "load": ld, "seed": int(s)}
            for p in args.papers.split(",") for a in ARMS[p] for ld in (loads or LOADS[p])
            for s in args.seeds.split(",")]
    cache = harness.RunCache(args.cache) if args.cache else None

    def progress(job, res):
        print(f"{job} -> {res.get('error') or round(res.get('token_goodput', 0), 2)}",
              file=sys.stderr, flush=True)

    rows = harness.run_jobs(harness.importable(one_run), jobs, harness.Fanout.from_args(args),
                            cache=cache, on_result=progress)
    summary = compare(rows)
    harness.write_json(args.out, {"claims": CLAIMS, "summary": summary, "runs": rows})
    md = markdown(summary)
    Path(args.out).with_suffix(".md").write_text(md)
    print(md)
    print(Path(args.out).name, "written", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
