"""Router decision latency in-process: p50/p99 of ``pick`` and of ``on_start`` (the index
update that follows each decision) at 10,000 active sessions and 64 replicas.

Workload: 200 agents (Zipf popularity), anchors of 32-256 blocks, sessions growing by
4-48 blocks per turn (capped at 1,024 blocks), replica loads from a sliding window of
in-flight requests, capacity 50,000 blocks per replica. Warm-up routes every session's
first turns; the measured phase routes further turns of random active sessions.
Target (issue 5): ``pick`` p99 < 200 us for every policy.

Two clocks per decision: wall time (``perf_counter_ns``) and the thread's CPU time
(``thread_time_ns``). On a shared machine a decision that spans a scheduler preemption
shows a multi-millisecond wall time that is not the router's cost; the CPU-time p99 is
the decision's own cost and is what the target is checked against. The load average at
the start is recorded next to the numbers.

    .venv/bin/python bench/bench_router.py [--sessions 10000] [--replicas 64]
        [--decisions 20000] [--policies agent,prefix,...] [--out bench/results/router.json]
    .venv/bin/python bench/bench_router.py --sim [--sim-replicas 4,8] [--sim-scales 2.5,2,1.75,1.5]
        [--sim-topology random|selector|pipeline|...] [--jobs 2] [--out bench/results/router_sim.json]
    .venv/bin/python bench/bench_router.py --sim --sim-capacities 4000,8000,16000,profile
        [--sim-cache runs.jsonl]
    .venv/bin/python bench/bench_router.py --sim --sim-bound 4:1.75,8:1.5 [--sim-capacity 4000]

``--sim`` measures instead placement quality in the cluster simulator
(``anchorage.sim.cluster``): ``h200-llama3-8b`` replicas (``--sim-replicas 4,8``) with
``--sim-capacity`` KV blocks each, every replica under the ``hybrid`` eviction policy,
on a generated multi-agent workload (``--sim-topology``, default ``random``; 16 agents, 400
sessions, 16 concurrent sessions per replica, seed 1), open-loop arrivals swept over
``--sim-scales`` (trace time multipliers: 2.0 = half the trace's rate). For each size:
``round_robin`` and ``agent`` at every rate (the TTFT curve), and ``pooled`` (one cache of
the fleet's total size: the reference), ``prefix`` and ``least_loaded`` at the *knee*:
the lowest rate at which ``round_robin``'s TTFT p90 exceeds twice its value at the
lightest rate (queueing starts to dominate: "near saturation"). Targets (issue 5):
``agent`` >= 95 % of ``pooled``'s hit rate and >= ``prefix`` + 10 points, and TTFT p90 at
most half of ``round_robin``'s at the knee. Results: ``bench/results/router_sim.json``
(``random``), ``bench/results/router_sim_<topology>.json`` for another topology.

Each row also decomposes the fleet's prompt blocks (``anchorage.routing.analysis``):
``compulsory`` (no earlier prompt anywhere held the prefix), ``placement`` (an earlier
prompt on *another* replica held it, not this one), ``capacity`` (this replica had held
it and evicted it, or it was still being computed), so hit + compulsory + placement +
capacity = 1; ``anchor_*`` are the shares of placement and capacity on blocks shared
across sessions. For ``pooled`` (one cache) placement is 0 by definition.

``--sim-capacities 4000,8000,16000,profile`` sweeps the KV blocks per replica instead
(``profile`` = the hardware's own budget, 50,945 blocks of 16 tokens for Llama-3-8B on an
H200 at ``gpu_memory_utilization`` 0.9): at each capacity the knee is re-found (a larger
cache removes prefill work, so it moves to a higher rate), then ``agent``, ``pooled`` and
``prefix`` run there. ``--sim-cache FILE`` keeps finished runs (JSON lines) so a sweep
resumes and shares runs. Results: ``bench/results/router_sim_capacity_<topology>.json``.

``--sim-bound 4:1.75,8:1.5`` measures the placement bound at ``--sim-capacity``
(``anchorage.routing.oracle``): Belady on the pooled cache, ``agent`` with its placement
recorded, and Belady per replica, each knowing only its own requests' future, under that
placement replayed: what no eviction policy can beat with ``agent``'s placement.
Results: ``bench/results/router_sim_bound.json``.

``--serve`` measures instead the router's overhead through Ray Serve: sequential
``/v1/completions`` latency (p50/p99) sent directly to an upstream vs through the router
(real local Ray, inside a private network namespace it creates, as root), per policy;
the upstream is the tests' small OpenAI-compatible server. Results go under
``serve_overhead`` in the same JSON; the ``serve/noop`` row is Ray Serve's own floor (an
ingress that answers at once), so router cost = router row - noop row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anchorage.policies.base import RequestContext
from anchorage.routing import make_router, router_names
from anchorage.routing.base import ReplicaView


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Workload:
    def __init__(self, sessions: int, agents: int, seed: int) -> None:
        self.rng = random.Random(seed)
        weights = [1 / (i + 1) for i in range(agents)]
        self.agent_of = self.rng.choices(range(agents), weights=weights, k=sessions)
        self.anchor = {a: [(a, "anchor", i) for i in range(self.rng.randint(32, 256))]
                       for a in range(agents)}
        self.history: list[list] = [[] for _ in range(sessions)]
        self.n = 0

    def request(self, s: int, now: float) -> RequestContext:
        h = self.history[s]
        anchor = self.anchor[self.agent_of[s]]
        room = 1024 - len(anchor) - len(h)
        if room > 0:
            h.extend((s, len(h) + i) for i in range(min(room, self.rng.randint(4, 48))))
        keys = anchor + h
        self.n += 1
        return RequestContext(request_id=self.n, keys=keys, input_length=len(keys) * 16 + 5,
                              session_id=str(s), now_s=now)


def bench_policy(name: str, args) -> dict:
    wl = Workload(args.sessions, args.agents, args.seed)
    router = make_router(name)
    views = [ReplicaView(index=i, name=f"replica-{i}", capacity_blocks=args.capacity)
             for i in range(args.replicas)]
    inflight: deque = deque()
    window = args.replicas * 8                 # ~8 requests in flight per replica
    pick_us, start_us, pick_cpu_us = [], [], []
    rng = random.Random(args.seed + 1)
    order = list(range(args.sessions)) * 2                       # warm-up: two turns each
    order += [rng.randrange(args.sessions) for _ in range(args.decisions)]
    warm = len(order) - args.decisions
    now = 0.0
    for i, s in enumerate(order):
        now += 0.001
        ctx = wl.request(s, now)
        if len(inflight) >= window:
            views[inflight.popleft()].running -= 1
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        p = router.pick(ctx, views)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        router.on_start(ctx, views[p].index)
        t2 = time.perf_counter_ns()
        views[p].running += 1
        inflight.append(p)
        if i >= warm:
            pick_us.append((t1 - t0) / 1e3)
            pick_cpu_us.append((c1 - c0) / 1e3)
            start_us.append((t2 - t1) / 1e3)
    return {"policy": name, "decisions": len(pick_us),
            "pick_p50_us": statistics.median(pick_us), "pick_p99_us": pct(pick_us, 0.99),
            "pick_cpu_p50_us": statistics.median(pick_cpu_us),
            "pick_cpu_p99_us": pct(pick_cpu_us, 0.99),
            "on_start_p50_us": statistics.median(start_us),
            "on_start_p99_us": pct(start_us, 0.99),
            "mean_keys": statistics.mean(len(wl.anchor[wl.agent_of[s]]) + len(wl.history[s])
                                         for s in range(args.sessions))}


def serve_overhead(args) -> int:
    """Runs inside the private network namespace (see ``--serve``)."""
    import asyncio
    import threading

    import httpx
    import ray
    from anchorage.router.app import build_app
    from anchorage.router.config import RouterConfig
    from ray import serve

    from tests.router.fake_upstream import FakeUpstream

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    ups = [FakeUpstream(f"u{i}") for i in range(2)]
    urls = [f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(u.start(), loop).result()}"
            for u in ups]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             namespace="anchorage-bench", logging_level="WARNING", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    rng = random.Random(0)
    bodies = [{"model": "tiny", "max_tokens": 1,
               "prompt": [rng.randrange(1000) for _ in range(16 * rng.randint(4, 64))]}
              for _ in range(args.requests)]

    def measure(base: str, session: bool) -> list[float]:
        out = []
        with httpx.Client(timeout=30) as c:
            for i, b in enumerate(bodies):
                h = {"x-session-id": f"s{i % 50}"} if session else {}
                t0 = time.perf_counter()
                r = c.post(base + "/v1/completions", json=b, headers=h)
                out.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
        return out[20:]                                   # warm connections first

    rows = []
    direct = measure(urls[0], False)
    rows.append({"path": "direct", "p50_ms": statistics.median(direct), "p99_ms": pct(direct, 0.99)})

    # Ray Serve's own floor: an ingress that answers without routing or proxying.
    from fastapi import FastAPI
    noop_api = FastAPI()

    @serve.deployment(name="noop")
    @serve.ingress(noop_api)
    class Noop:
        @noop_api.post("/v1/completions")
        async def completions(self) -> dict:
            return {"choices": [{"text": ""}]}
    serve.run(Noop.bind(), name="anchorage-router", route_prefix="/")
    lat = measure("http://127.0.0.1:8000", False)
    rows.append({"path": "serve/noop", "p50_ms": statistics.median(lat), "p99_ms": pct(lat, 0.99)})
    for i, policy in enumerate(args.policies.split(",")):
        cfg = RouterConfig(replicas=urls, policy=policy, actor_name=f"bench-state-{i}").validate()
        serve.run(build_app(cfg), name="anchorage-router", route_prefix="/")
        lat = measure("http://127.0.0.1:8000", True)
        rows.append({"path": f"router/{policy}", "p50_ms": statistics.median(lat),
                     "p99_ms": pct(lat, 0.99)})
        ray.kill(ray.get_actor(cfg.actor_name))
    serve.shutdown()
    ray.shutdown()
    base = rows[0]["p50_ms"]
    print(f"{'path':<24}{'p50 ms':>10}{'p99 ms':>10}{'overhead p50 ms':>18}  "
          f"({args.requests - 20} sequential requests; load average {os.getloadavg()[0]:.1f})")
    for r in rows:
        r["overhead_p50_ms"] = r["p50_ms"] - base
        print(f"{r['path']:<24}{r['p50_ms']:>10.2f}{r['p99_ms']:>10.2f}{r['overhead_p50_ms']:>18.2f}")
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {}
    data["serve_overhead"] = {"requests": args.requests - 20, "load_average": os.getloadavg()[0],
                              "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    return 0


# ---------------------------------------------------------------------------------------
# --sim: placement quality in the cluster simulator

SIM_AGENTS, SIM_SESSIONS, SIM_CONCURRENCY_PER_REPLICA = 16, 400, 16
_TRACES: dict = {}


def _sim_trace(replicas: int, topology: str = "random"):
    if (replicas, topology) not in _TRACES:
        from anchorage.sim.replay import make_contexts
        from anchorage.trace.generate import generate
        _, recs = generate(topology, SIM_AGENTS, SIM_SESSIONS, seed=1,
                           block_size=16, concurrency=SIM_CONCURRENCY_PER_REPLICA * replicas)
        _TRACES[replicas, topology] = (recs, make_contexts(recs))
    return _TRACES[replicas, topology]


def _sim_config(replicas: int, capacity: int, scale: float):
    """The --sim setup: ``h200-llama3-8b`` replicas, 16-token blocks, open-loop arrivals."""
    from anchorage.sim.cluster import TimedConfig
    from anchorage.sim.profiles import get_profile
    return TimedConfig(get_profile("h200-llama3-8b").with_(block_size=16), replicas=replicas,
                       mode="open", time_scale=scale, capacity_blocks=capacity)


def _miss_loss(sim) -> dict:
    """``miss_decomposition`` of a finished run's measured requests, in admission order
    (one cache for ``pooled``)."""
    from anchorage.routing.analysis import miss_decomposition
    done = sorted((r for r in sim.completed if r.measured and r.admitted_s is not None),
                  key=lambda r: (r.admitted_s, r.index))
    return miss_decomposition((r.ctx.keys, 0 if sim.pooled else r.replica, r.hit_blocks,
                               r.session) for r in done)


def sim_run(job: tuple) -> dict:
    """One simulation: (replicas, capacity, time scale, router, eviction policy, topology)."""
    from anchorage.sim.cluster import simulate_timed
    replicas, capacity, scale, router, policy, topology = job
    recs, ctxs = _sim_trace(replicas, topology)
    cfg = _sim_config(replicas, capacity, scale)
    t0 = time.perf_counter()
    c0 = time.process_time()
    sim, res = simulate_timed(recs, ctxs, cfg, policy, router)
    cpu = time.process_time() - c0
    span = recs[-1].timestamp / 1000.0 * scale
    util = [p["utilization"] for p in res["per_replica"]]
    loss = _miss_loss(sim)
    return {"topology": topology, "replicas": replicas, "capacity_blocks": capacity,
            "time_scale": scale,
            "rate_rps": len(recs) / span, "router": router, "policy": policy,
            "hit_rate": res["hit_rate"], "ttft_p50_s": res["ttft_p50_s"],
            "ttft_p90_s": res["ttft_p90_s"], "ttft_mean_s": res["ttft_mean_s"],
            "throughput_rps": res["throughput_rps"], "preemptions": res["preemptions"],
            "utilization_mean": sum(util) / len(util), "utilization_max": max(util),
            "requests": res["requests"], "loss": loss,
            "decisions": dict(getattr(sim.router, "decisions", None) or {}),
            "sim_s": time.perf_counter() - t0, "sim_cpu_s": cpu}


def bound_run(replicas: int, capacity: int, scale: float, topology: str, label: str,
              policy_of, router, pooled: bool = False) -> dict:
    """One simulation with a policy per replica (``policy_of(replica, contexts)``) and a
    router object: the oracle runs of ``--sim-bound``."""
    from anchorage.policies.base import RequestContext as Ctx
    from anchorage.sim.cluster import ClusterSim, build_workload, summarize
    recs, ctxs0 = _sim_trace(replicas, topology)
    cfg = _sim_config(replicas, capacity, scale)
    ctxs = [Ctx(**{f: getattr(c, f) for f in c.__slots__}) for c in ctxs0]
    built = iter(range(replicas))  # ClusterSim builds one policy per replica, in order
    c0 = time.process_time()
    sim = ClusterSim(cfg, lambda: policy_of(next(built, 0), ctxs), router, pooled=pooled)
    sim.run(build_workload(recs, ctxs, cfg))
    res = summarize(sim, None, label, label)
    loss = _miss_loss(sim)
    return {"label": label, "topology": topology, "replicas": replicas,
            "capacity_blocks": capacity, "time_scale": scale,
            "rate_rps": len(recs) / (recs[-1].timestamp / 1000.0 * scale),
            "hit_rate": res["hit_rate"], "ttft_p90_s": res["ttft_p90_s"], "loss": loss,
            "sim_cpu_s": time.process_time() - c0}


def sim_bound(args) -> int:
    """``--sim-bound R:SCALE,...``: how close any eviction policy can bring separate caches
    to the pooled one, at each size's knee (``anchorage.routing.oracle``): Belady on the
    pooled cache; ``agent`` with ``--sim-policy`` (its placement recorded); Belady per
    replica, each knowing only its own future, under that placement replayed."""
    from anchorage.policies.registry import make_policy
    from anchorage.routing.oracle import (
        RecordingRouter,
        ReplayRouter,
        replica_future_belady,
    )
    pol, cap, topo = args.sim_policy, args.sim_capacity, args.sim_topology
    out = Path(args.out)
    data = json.loads(out.read_text()) if out.exists() else {
        "benchmark": "router_sim_bound", "profile": "h200-llama3-8b", "rows": [],
        "summary": []}
    print(f"placement bound, {cap} blocks per replica, {topo} topology, policy {pol}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    cache_path, cache = _load_run_cache(args.sim_cache)
    for item in args.sim_bound.split(","):
        n, sc = int(item.split(":")[0]), float(item.split(":")[1])
        pooled_pol = dict(_cached_run((n, cap, sc, "pooled", pol, topo), cache, cache_path),
                          label=f"pooled/{pol}")
        pooled_b = bound_run(n, cap, sc, topo, "pooled/belady",
                             lambda r, c: make_policy("belady", block_size=16, contexts=c),
                             None, pooled=True)
        rec = RecordingRouter(make_router("agent"))
        agent = bound_run(n, cap, sc, topo, f"agent/{pol}",
                          lambda r, c: make_policy(pol, block_size=16), rec)
        assign = rec.assignment
        part_b = bound_run(n, cap, sc, topo, "agent placement/belady (own replica's future)",
                           lambda r, c, a=assign: replica_future_belady(c, 16, a, r),
                           ReplayRouter(assign))
        rows = [pooled_pol, pooled_b, agent, part_b]
        s = {"replicas": n, "capacity_blocks": cap, "time_scale": sc, "topology": topo,
             "pooled_policy_hit": pooled_pol["hit_rate"], "pooled_belady_hit": pooled_b["hit_rate"],
             "agent_hit": agent["hit_rate"], "partitioned_belady_hit": part_b["hit_rate"],
             "partitioned_over_pooled_belady": part_b["hit_rate"] / pooled_b["hit_rate"],
             "partitioned_belady_over_pooled_policy": part_b["hit_rate"] / pooled_pol["hit_rate"],
             "agent_over_pooled_policy": agent["hit_rate"] / pooled_pol["hit_rate"]}
        for r in rows:
            print(f"  {n} replicas {r['label']:<48}{r['hit_rate']:>8.1%}  TTFT p90 "
                  f"{r['ttft_p90_s']:.2f} s", flush=True)
        print(f"  partitioned belady / pooled belady {s['partitioned_over_pooled_belady']:.1%}; "
              f"/ pooled {pol} {s['partitioned_belady_over_pooled_policy']:.1%}", flush=True)
        key = (n, cap, sc, topo)
        data["rows"] = [r for r in data["rows"] if (r["replicas"], r["capacity_blocks"],
                                                    r["time_scale"], r["topology"]) != key] + rows
        data["summary"] = [x for x in data["summary"] if (x["replicas"], x["capacity_blocks"],
                                                          x["time_scale"], x["topology"]) != key]
        data["summary"].append(s)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1))
    return 0


def _map(fn, jobs: list, n: int) -> list:
    if n <= 1:
        return [fn(j) for j in jobs]
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(n) as pool:
        return pool.map(fn, jobs, chunksize=1)


def knee(curve: list[dict]) -> dict:
    """The lowest rate whose TTFT p90 exceeds twice the lightest rate's (else the heaviest)."""
    curve = sorted(curve, key=lambda r: r["rate_rps"])
    base = curve[0]["ttft_p90_s"]
    return next((r for r in curve if r["ttft_p90_s"] > 2 * base), curve[-1])


def sim_bench(args) -> int:
    sizes = [int(x) for x in args.sim_replicas.split(",")]
    scales = sorted((float(x) for x in args.sim_scales.split(",")), reverse=True)
    pol, cap, topo = args.sim_policy, args.sim_capacity, args.sim_topology
    load = os.getloadavg()[0]
    print(f"cluster simulation, h200-llama3-8b, {cap} blocks per replica, {pol} eviction, "
          f"{topo} topology, open loop; load average {load:.1f}", flush=True)
    rows = _map(sim_run, [(n, cap, sc, r, pol, topo) for n in sizes for sc in scales
                          for r in ("round_robin", "agent")], args.jobs)
    knees = {}
    for n in sizes:
        rr = [r for r in rows if r["replicas"] == n and r["router"] == "round_robin"]
        knees[n] = knee(rr)["time_scale"]
    rows += _map(sim_run, [(n, cap, knees[n], r, pol, topo) for n in sizes
                           for r in ("pooled", "prefix", "least_loaded")], args.jobs)
    summary = []
    for n in sizes:
        print(f"\n{n} replicas: TTFT p90 curve (knee: time scale {knees[n]})")
        print(f"{'rate rps':>9}{'rr p90 s':>10}{'agent p90 s':>13}{'ratio':>7}{'rr hit':>8}"
              f"{'agent hit':>10}{'rr util':>9}")
        for sc in scales:
            a = next(r for r in rows if (r["replicas"], r["time_scale"], r["router"]) == (n, sc, "agent"))
            b = next(r for r in rows if (r["replicas"], r["time_scale"], r["router"]) == (n, sc, "round_robin"))
            print(f"{b['rate_rps']:>9.2f}{b['ttft_p90_s']:>10.2f}{a['ttft_p90_s']:>13.2f}"
                  f"{a['ttft_p90_s'] / b['ttft_p90_s']:>7.2f}{b['hit_rate']:>8.1%}"
                  f"{a['hit_rate']:>10.1%}{b['utilization_mean']:>9.2f}")
        at = {r["router"]: r for r in rows if r["replicas"] == n and r["time_scale"] == knees[n]}
        ref = at["pooled"]["hit_rate"]
        print(f"{'router':<14}{'hit':>8}{'% pooled':>10}{'TTFT p90 s':>12}{'p50 s':>8}"
              f"{'compuls.':>10}{'placem.':>9}{'capacity':>10}  at the knee "
              f"({at['round_robin']['rate_rps']:.2f} req/s)")
        for name in ("pooled", "agent", "prefix", "least_loaded", "round_robin"):
            r = at[name]
            lo = r["loss"]
            print(f"{name:<14}{r['hit_rate']:>8.1%}{r['hit_rate'] / ref:>10.1%}"
                  f"{r['ttft_p90_s']:>12.2f}{r['ttft_p50_s']:>8.2f}{lo['compulsory']:>10.1%}"
                  f"{lo['placement']:>9.1%}{lo['capacity']:>10.1%}")
        a = at["agent"]
        s = {"replicas": n, "knee_time_scale": knees[n], "knee_rate_rps": a["rate_rps"],
             "agent_pct_of_pooled": a["hit_rate"] / ref,
             "agent_minus_prefix_points": 100 * (a["hit_rate"] - at["prefix"]["hit_rate"]),
             "agent_ttft_p90_over_round_robin": a["ttft_p90_s"] / at["round_robin"]["ttft_p90_s"]}
        s["targets_met"] = {"pct_of_pooled>=95": s["agent_pct_of_pooled"] >= 0.95,
                            "vs_prefix>=+10": s["agent_minus_prefix_points"] >= 10,
                            "ttft_p90<=half_rr": s["agent_ttft_p90_over_round_robin"] <= 0.5}
        summary.append(s)
        print(f"agent: {s['agent_pct_of_pooled']:.1%} of pooled, "
              f"{s['agent_minus_prefix_points']:+.1f} points vs prefix, TTFT p90 x"
              f"{s['agent_ttft_p90_over_round_robin']:.2f} of round_robin; {s['targets_met']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "router_sim_placement", "profile": "h200-llama3-8b", "policy": pol,
        "capacity_blocks": cap, "workload": {"topology": topo, "agents": SIM_AGENTS,
                                             "sessions": SIM_SESSIONS,
                                             "concurrency_per_replica": SIM_CONCURRENCY_PER_REPLICA,
                                             "seed": 1, "block_size": 16},
        "arrivals": "open", "knee_rule": "lowest rate with round_robin TTFT p90 > 2x the lightest rate's",
        "load_average": load, "summary": summary, "rows": rows}, indent=1))
    return 0


SWEEP_SCALES = (2.5, 2.0, 1.75, 1.5, 1.25, 1.0, 0.85, 0.7, 0.55, 0.45, 0.35)


def _cached_run(job: tuple, cache: dict, cache_path: Path | None) -> dict:
    key = json.dumps(job)
    if key not in cache:
        cache[key] = sim_run(job)
        if cache_path is not None:
            with cache_path.open("a") as f:
                f.write(json.dumps({"job": job, "row": cache[key]}) + "\n")
    return cache[key]


def _load_run_cache(path: str) -> tuple[Path | None, dict]:
    """``--sim-cache``: the finished runs of a JSON-lines file (job -> row), and its path."""
    cache_path = Path(path) if path else None
    cache: dict = {}
    if cache_path is not None and cache_path.exists():
        for line in cache_path.read_text().splitlines():
            d = json.loads(line)
            cache[json.dumps(d["job"])] = d["row"]
    return cache_path, cache


def sim_capacity_sweep(args) -> int:
    """``--sim-capacities``: the knee re-found at each capacity, then agent vs pooled,
    prefix and round_robin there (see ``sweep_one``)."""
    from anchorage.sim.profiles import get_profile
    hw = get_profile("h200-llama3-8b").with_(block_size=16).capacity_blocks
    caps = sorted({hw if c.strip() == "profile" else int(c) for c in args.sim_capacities.split(",")})
    sizes = [int(x) for x in args.sim_replicas.split(",")]
    pol, topo = args.sim_policy, args.sim_topology
    cache_path, cache = _load_run_cache(args.sim_cache)
    load = os.getloadavg()[0]
    print(f"capacity sweep, h200-llama3-8b (hardware KV budget {hw} blocks of 16 tokens), "
          f"{pol} eviction, {topo} topology, open loop; load average {load:.1f}", flush=True)
    summary, rows = [], []
    for n in sizes:
        start = 1
        for cap in caps:
            s, used, start = sweep_one(n, cap, pol, topo, start, cache, cache_path)
            summary.append(s)
            rows += used
            print(f"{n} replicas, {cap:>6} blocks: knee {s['knee_rate_rps']:.2f} req/s "
                  f"(scale {s['knee_time_scale']}); pooled {s['pooled_hit']:.1%} agent "
                  f"{s['agent_hit']:.1%} ({s['agent_pct_of_pooled']:.1%}) prefix "
                  f"{s['prefix_hit']:.1%} ({s['agent_minus_prefix_points']:+.1f}) rr "
                  f"{s['round_robin_hit']:.1%}; TTFT p90 agent/rr "
                  f"{s['agent_ttft_p90_over_round_robin']:.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "router_sim_capacity_sweep", "profile": "h200-llama3-8b",
        "hardware_capacity_blocks": hw, "policy": pol, "capacities": caps,
        "workload": {"topology": topo, "agents": SIM_AGENTS, "sessions": SIM_SESSIONS,
                     "concurrency_per_replica": SIM_CONCURRENCY_PER_REPLICA, "seed": 1,
                     "block_size": 16},
        "arrivals": "open", "scales": list(SWEEP_SCALES),
        "knee_rule": "lowest rate with round_robin TTFT p90 > 2x its value at scale 2.5; "
                     "the search starts at the previous (smaller) capacity's knee",
        "load_average": load, "summary": summary, "rows": rows}, indent=1))
    return 0


def sweep_one(n: int, cap: int, pol: str, topo: str, start: int, cache: dict,
              cache_path: Path | None) -> tuple[dict, list, int]:
    """One (replicas, capacity): round_robin at the lightest scale (the TTFT base), then
    heavier scales from ``start`` until its TTFT p90 exceeds twice the base (the knee);
    agent, pooled and prefix at the knee. A larger cache only removes prefill work, so
    a capacity's knee is never at a lower rate than a smaller capacity's: the search for
    the next capacity starts at this knee (the scales it skips are not run)."""
    run = lambda sc, r: _cached_run((n, cap, sc, r, pol, topo), cache, cache_path)
    base = run(SWEEP_SCALES[0], "round_robin")
    used = [base]
    i = max(start, 1)
    while True:
        rr = run(SWEEP_SCALES[i], "round_robin")
        used.append(rr)
        if rr["ttft_p90_s"] > 2 * base["ttft_p90_s"] or i == len(SWEEP_SCALES) - 1:
            break
        i += 1
    sc = SWEEP_SCALES[i]
    at = {"round_robin": rr}
    for r in ("agent", "pooled", "prefix"):
        at[r] = run(sc, r)
        used.append(at[r])
    ref = at["pooled"]["hit_rate"]
    a = at["agent"]
    s = {"replicas": n, "capacity_blocks": cap, "knee_time_scale": sc,
         "knee_rate_rps": a["rate_rps"], "knee_found": rr["ttft_p90_s"] > 2 * base["ttft_p90_s"],
         "round_robin_base_ttft_p90_s": base["ttft_p90_s"],
         **{f"{r}_hit": at[r]["hit_rate"] for r in at},
         **{f"{r}_ttft_p90_s": at[r]["ttft_p90_s"] for r in at},
         **{f"{r}_loss": {k: at[r]["loss"][k] for k in ("compulsory", "placement", "capacity")}
            for r in at},
         "agent_pct_of_pooled": a["hit_rate"] / ref,
         "agent_minus_prefix_points": 100 * (a["hit_rate"] - at["prefix"]["hit_rate"]),
         "agent_ttft_p90_over_round_robin": a["ttft_p90_s"] / rr["ttft_p90_s"]}
    s["targets_met"] = {"pct_of_pooled>=95": s["agent_pct_of_pooled"] >= 0.95,
                        "vs_prefix>=+10": s["agent_minus_prefix_points"] >= 10,
                        "ttft_p90<=half_rr": s["agent_ttft_p90_over_round_robin"] <= 0.5}
    return s, used, i


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--decisions", type=int, default=20_000)
    ap.add_argument("--capacity", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(router_names()))
    ap.add_argument("--out", default="bench/results/router.json")
    ap.add_argument("--serve", action="store_true", help="router overhead through Ray Serve")
    ap.add_argument("--requests", type=int, default=300, help="--serve: requests per path")
    ap.add_argument("--sim", action="store_true", help="placement quality in the cluster simulator")
    ap.add_argument("--sim-replicas", default="4,8")
    ap.add_argument("--sim-scales", default="2.5,2,1.75,1.5",
                    help="open-loop trace time multipliers (the rate sweep)")
    ap.add_argument("--sim-capacity", type=int, default=4000, help="KV blocks per replica")
    ap.add_argument("--sim-policy", default="hybrid", help="eviction policy of every replica")
    ap.add_argument("--sim-topology", default="random",
                    help="generated workload topology (random, selector, pipeline, ...)")
    ap.add_argument("--jobs", type=int, default=1, help="--sim: parallel simulations")
    ap.add_argument("--sim-capacities", default="",
                    help="--sim: capacity sweep instead (KV blocks per replica, comma list; "
                         "'profile' = the hardware's budget), the knee re-found at each")
    ap.add_argument("--sim-bound", default="",
                    help="--sim: the Belady placement bound instead, at REPLICAS:SCALE,... "
                         "(--sim-capacity blocks) -> bench/results/router_sim_bound.json")
    ap.add_argument("--sim-cache", default="",
                    help="--sim-capacities, --sim-bound: JSON-lines file of finished "
                         "standard runs (reused, and resumed)")
    args = ap.parse_args()
    if args.sim:
        from anchorage.trace.generate import TOPOLOGIES
        if args.sim_topology not in TOPOLOGIES:
            ap.error(f"--sim-topology must be one of {', '.join(TOPOLOGIES)}")
        if args.sim_bound:
            if args.out == "bench/results/router.json":
                args.out = "bench/results/router_sim_bound.json"
            return sim_bound(args)
        if args.sim_capacities:
            if args.out == "bench/results/router.json":
                args.out = f"bench/results/router_sim_capacity_{args.sim_topology}.json"
            return sim_capacity_sweep(args)
        if args.out == "bench/results/router.json":
            args.out = ("bench/results/router_sim.json" if args.sim_topology == "random"
                        else f"bench/results/router_sim_{args.sim_topology}.json")
        return sim_bench(args)
    if args.serve:
        if args.policies == ",".join(router_names()):
            args.policies = "round_robin,agent"
        if os.environ.get("ANCHORAGE_BENCH_NETNS") != "1":
            import shutil
            import subprocess
            import tempfile
            if os.geteuid() != 0 or not shutil.which("unshare"):
                print("--serve needs root and unshare (it runs Ray in a private network "
                      "namespace)", file=sys.stderr)
                return 2
            home = tempfile.mkdtemp(prefix="anchorage-bench-home-")
            inner = " ".join(f"'{a}'" for a in [sys.executable] + sys.argv)
            return subprocess.call(
                ["unshare", "-n", "--", "sh", "-c", f"ip link set lo up && exec {inner}"],
                env=dict(os.environ, ANCHORAGE_BENCH_NETNS="1", HOME=home,
                         RAY_USAGE_STATS_ENABLED="0"))
        return serve_overhead(args)
    rows = []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
    print(f"{args.sessions} sessions, {args.replicas} replicas; load average {load:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    print(f"{'policy':<16}{'pick p50':>10}{'pick p99':>10}{'cpu p50':>10}{'cpu p99':>10}"
          f"{'on_start p50':>14}{'on_start p99':>14}  (us) target cpu p99<200")
    for name in args.policies.split(","):
        r = bench_policy(name, args)
        rows.append(r)
        ok = "ok" if r["pick_cpu_p99_us"] < 200 else "MISS"
        print(f"{name:<16}{r['pick_p50_us']:>10.1f}{r['pick_p99_us']:>10.1f}"
              f"{r['pick_cpu_p50_us']:>10.1f}{r['pick_cpu_p99_us']:>10.1f}"
              f"{r['on_start_p50_us']:>14.1f}{r['on_start_p99_us']:>14.1f}  {ok}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    Path(args.out).write_text(json.dumps({**({"serve_overhead": prev["serve_overhead"]}
                                             if "serve_overhead" in prev else {}),
        "benchmark": "router_decision_latency", "sessions": args.sessions,
        "replicas": args.replicas, "agents": args.agents, "decisions": args.decisions,
        "capacity_blocks": args.capacity, "load_average": load, "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(), "rows": rows}, indent=1))
    return 0 if all(r["pick_cpu_p99_us"] < 200 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
