"""The real emitters behind the dashboards, for checking panel queries and rules against
a real Prometheus: each series comes from the code that exports it in production.

- vLLM (``vllm:*``): vLLM's ``PrometheusStatLogger`` in its own process
  (``tests/chart/vllm_emitter.py``), one engine index per pod, fed scheduler and iteration
  stats as its engine core feeds it;
- node agent (``anchorage_*`` of docs/metrics.md's first table): a real sidecar per pod
  (``tests/node_agent/harness.py``: its HTTP server and ``node_agent.metrics``), reading the
  snapshots the real exporter writes from a real ``hybrid`` policy wrapped in the engine's
  spatial tiering (``node_agent.tiering.EngineTiering``), driven by a generated multi-agent
  workload through the simulator's block pool, with the plugin's ``NodeState`` and its
  eviction counters (``block_pool_stats``). Only the temporal-tiering counters are a
  stand-in: they come from vLLM's offloading connector, which the CPU build has not; the
  host tier's series come from the real ``HostTierTracker`` (``node_agent.offload``) fed
  the events its connector feeds it, its ``host_tier.json`` read by the sidecar;
- router (``anchorage_router_*``): the real ``RoutingState`` and its ``RouterMetrics``,
  routing requests to two discovered pods;
- operator (``anchorage_operator_*``): ``anchorage.operator.metrics`` recording reconcile
  passes (scale events, tuning runs, errors).

``documented()`` reads docs/metrics.md's tables, so a test can compare what the emitters
emit with what the docs promise.
"""

from __future__ import annotations

import dataclasses
import random
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from anchorage.warmup import WarmupConfig
from tests.conftest import REPO

DOC = REPO / "docs" / "metrics.md"
NAMESPACE = "llm"
# What the chart's PodMonitor asks for (its scrapeProtocols: PrometheusText0.0.4)
CLASSIC_TEXT = "text/plain;version=0.0.4"
# What Prometheus 2.x asks for by default
PROMETHEUS_2_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                       "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
MODEL = "llama-8b"
PODS = {"llama-8b-0": 0.6, "llama-8b-1": 0.3}   # pod -> its engine's prefix-cache hit rate


@dataclass(frozen=True)
class Series:
    """One documented metric: name (with _total for counters), type, labels, emitter."""

    name: str
    type: str      # counter | gauge | histogram
    labels: tuple[str, ...]
    emitter: str   # node-agent | router | operator | vllm


def documented(doc: Path = DOC) -> list[Series]:
    """The metric tables of docs/metrics.md (vLLM's rows carry model_name)."""
    out = []
    for line in doc.read_text().splitlines():
        m = re.match(r"\|\s*`((?:anchorage_|vllm:)[a-z_:]+)`\s*\|\s*([a-z]+)", line)
        if not m:
            continue
        name, kind = m.group(1), m.group(2)
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if name.startswith("vllm:"):
            out.append(Series(name, kind, ("model_name",), "vllm"))
            continue
        labels = tuple(re.findall(r"`([a-z_]+)`", cells[2]))
        em = re.search(r"emitted by ([a-z-]+)", cells[-1])
        assert em, f"docs/metrics.md: {name} does not say which component emits it"
        out.append(Series(name, kind, labels, em.group(1)))
    return out


def documented_reasons(doc: Path = DOC) -> set[str]:
    """The eviction ``reason`` values docs/metrics.md lists for anchorage_evictions_total."""
    row = next(ln for ln in doc.read_text().splitlines()
               if ln.startswith("| `anchorage_evictions_total`"))
    meaning = row.split("|")[4]
    return set(re.findall(r"`([a-z_]+)` \(", meaning))


def _serve(registry):
    from tests.support.prometheus import serve_text_format

    return serve_text_format(registry)


class _Loop:
    """A daemon thread calling ``step()`` every ``every_s`` until ``stop()``."""

    def __init__(self, step, every_s: float):
        self._stop = threading.Event()
        self.error: BaseException | None = None

        def run():
            while not self._stop.wait(every_s):
                try:
                    step()
                except BaseException as exc:  # noqa: BLE001 - reported by stop()
                    self.error = exc
                    return
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise self.error


# -- vLLM -----------------------------------------------------------------------------------

class VLLMEngines:
    """vLLM's exporter in a subprocess, one engine index per pod (``engine="<i>"``)."""

    def __init__(self, workdir: Path, rates: list[float], timeout_s: float = 240.0):
        self.log = workdir / "vllm-emitter.log"
        port_file = workdir / "vllm-emitter.port"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chart.vllm_emitter", str(port_file), MODEL,
                 *map(str, rates)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s   # ~30 s here: building vLLM's config
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("vLLM's exporter did not start:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        self.port = int(port_file.read_text())

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- node agent -------------------------------------------------------------------------------

class _PluginTiering:
    """The engine's tiering wrapper as the plugin builds it: spatial reservations from the
    real ``EngineTiering``; the temporal counters (offload gate decisions, reloads, bytes
    moved) in the snapshot format ``node_agent.temporal`` writes, advanced per request
    (the stand-in: vLLM's CPU build has no offloading connector to produce them)."""

    def __new__(cls, inner, interval: int = 4):
        from anchorage.node_agent.tiering import EngineTiering

        class PluginTiering(EngineTiering):
            offloads = {"ok": 0, "low_pressure": 0}
            reloads = {"in_time": 0, "late": 0, "wasted": 0}
            moved = {"d2h": 0, "h2d": 0}

            def on_request(self, ctx):
                super().on_request(ctx)
                if ctx.tool_name:
                    self.offloads["ok" if ctx.tool_name == "test" else "low_pressure"] += 1
                    self.reloads["in_time"] += 1
                    self.reloads["late"] += hash(ctx.request_id) % 4 == 0
                    self.moved["d2h"] += 4096
                    self.moved["h2d"] += 2048

            def tiering_view(self):
                return {**super().tiering_view(), "mode": "spatial,temporal",
                        "offloads": dict(self.offloads), "reloads": dict(self.reloads),
                        "bytes": dict(self.moved)}

        return PluginTiering(inner, interval=interval)


class _HostTier:
    """The host tier's scheduler-side tracker, fed what ``AnchorageOffloadingConnector``
    feeds it per request (arrival, blocks from GPU and host memory, the end of a turn with
    the pool's readings at a tool stall, the worker's transfer statistics and failures),
    writing the ``host_tier.json`` snapshot the sidecar reads."""

    def __init__(self, workdir: Path):
        from anchorage.node_agent.offload.tracker import HOST_TIER_FILE, HostTierTracker
        from anchorage.tiering.host_tier import HostTierConfig
        from anchorage.tiering.params import TemporalParams
        from anchorage.tiering.returns import SessionReturns

        params = TemporalParams(host=HostTierConfig(capacity_bytes=256 * 4096))
        self.used = 0
        self.pool = {"peers": 1, "peer_hits": 0, "deduplicated": 0}  # the node pool's counts
        self.tracker = HostTierTracker(SessionReturns(params), capacity_chunks=256,
                                       chunk_bytes=4096, policy_name="anchorage",
                                       occupancy=lambda: self.used,
                                       node_pool=lambda: dict(self.pool))
        self.path = str(workdir / HOST_TIER_FILE)

    def request(self, ctx, pool, n: int) -> None:
        import math

        from anchorage.tiering.controller import PoolReading, SessionReading

        t, now = self.tracker, time.monotonic()
        meta = {"session": ctx.session_id, "tool": ctx.tool_name, "agent": ctx.agent_hint}
        t.arrived(ctx.request_id, meta, [k % 1000 for k in range(ctx.input_length)], now)
        host = 16 * (n % 3)   # some turns load part of their prefix from host memory
        t.allocated(ctx.request_id, max(0, ctx.input_length - host - 16), host, 16)
        blocks = max(1, ctx.input_length // 16)
        t.finished(ctx.request_id, now, lambda sid: (
            PoolReading(capacity_blocks=pool.capacity_blocks, free_blocks=pool.num_free_blocks,
                        cached_free_blocks=pool.num_cached_free_blocks, block_bytes=4096),
            SessionReading(gpu_blocks=blocks, copy_blocks=0, recompute_s=math.inf),
            [(sid, i) for i in range(blocks)]))
        t.transferred(4096 * blocks, 4096 * (host // 16), 1, int(host > 0))
        self.pool["peer_hits"] += host // 32   # part of the host hits from a peer's tier
        self.pool["deduplicated"] += int(n % 7 == 0)
        if n % 40 == 0:
            t.failed({"load_failures": 1, "timeouts": int(n % 80 == 0),
                      "peer_stale": int(n % 120 == 0)})
        self.used = min(256, self.used + 1)
        t.maybe_write(self.path, 0.2, now)


class NodeAgentPod:
    """A real sidecar exporting what a real policy in a (simulated) engine reports."""

    def __init__(self, workdir: Path, seed: int):
        from anchorage.node_agent import vllm_block_pool
        from anchorage.node_agent.exporter import block_pool_stats
        from anchorage.node_agent.recorder import NodeState
        from anchorage.policies.registry import make_policy
        from anchorage.pool.block_pool import BlockPool
        from tests.node_agent.harness import NodeAgent
        from tests.policies.agent_workload import pipeline_workload

        workdir.mkdir(parents=True, exist_ok=True)
        self.policy = _PluginTiering(make_policy("hybrid", block_size=16))
        self.state = NodeState(block_size=16)
        self.host = _HostTier(workdir)
        self.work = pipeline_workload(seed=seed, agents=4, sessions=60, steps=8,
                                      horizon_s=120.0)
        self.pool = BlockPool(128, 16, self.policy)
        self.live: deque = deque()   # requests running in the engine (their blocks held)
        self.agent = NodeAgent(workdir, None, model=MODEL, source=self.policy,
                               node_state=self.state, stats=block_pool_stats("hybrid"),
                               warmup=WarmupConfig(rate_per_s=20, burst=2, cooldown_s=1.0,
                                                   max_per_tick=4))
        self.agent.engine.on_completion = self._prefill
        self.agent.start()
        self._warmups = 0
        self._timers: list[threading.Timer] = []
        self._lock, self._closing = threading.Lock(), False
        self._i = 0
        self._evicted = 0
        self._stats = vllm_block_pool.STATS
        self._loop = _Loop(self.step, 0.01)

    @property
    def port(self) -> int:
        return self.agent.sidecar.port

    def step(self) -> None:
        """One request of the workload through the pool, as the engine's plugin sees it."""
        base = self.work[self._i % len(self.work)]
        lap = self._i // len(self.work)
        self._i += 1
        # the workload again and again, later each lap; the client names its agents
        ctx = dataclasses.replace(base, request_id=(lap, base.request_id),
                                  now_s=base.now_s + lap * 150.0, seq=-1,
                                  agent_hint=base.agent_truth)
        t0 = time.perf_counter()
        blocks = self.pool.allocate(ctx)
        self.state.record_decision(time.perf_counter() - t0)
        tokens = [int(k) % 1000 for k in ctx.keys for _ in range(16)][: ctx.input_length]
        self.state.observe(self.policy, ctx, tokens, now_s=time.time())
        if blocks is not None:
            self.live.append(blocks)
        self.host.request(ctx, self.pool, self._i)
        while len(self.live) > 12:   # twelve requests in flight, the oldest finishes
            self.pool.free(self.live.popleft())
        evicted = self.pool.stats.evictions
        self._stats.victims += evicted - self._evicted   # what the block-pool driver counts
        self._evicted = evicted
        if self._i % 50 == 0:
            self._stats.stock_victims += 1
            self._stats.errors += self._i % 500 == 0

    def _prefill(self, body: dict) -> None:
        """The engine caches what a warm-up prefills and says so in KV events, and evicts
        it again: every other one at once (before its agent comes back: wasted), the rest
        after a while (used first); then the agent can be warmed again."""
        from tests.node_agent.fake_engine import removed, stored

        self._warmups += 1
        toks = body["prompt"]
        hashes = [bytes([self._warmups % 256, self._warmups // 256 % 256, b])
                  for b in range(len(toks) // 16)]
        self.agent.engine.publish([stored(hashes, None, toks, 16)])
        later = 0.002 if self._warmups % 2 else 1.5
        with self._lock:
            if self._closing:
                return
            t = threading.Timer(later, self.agent.engine.publish, args=([removed(hashes)],))
            t.daemon = True
            self._timers = [x for x in self._timers if x.is_alive()] + [t]
            t.start()

    def close(self) -> None:
        self._loop.stop()
        self.agent.engine.on_completion = None
        with self._lock:
            self._closing = True
        for t in self._timers:   # no eviction published into a closed engine
            t.cancel()
            t.join(5)
        self.agent.stop()


# -- router -----------------------------------------------------------------------------------

class RouterEmitter:
    """The real routing state (agent routing over two discovered pods) and its metrics."""

    def __init__(self):
        from anchorage.policies.base import RequestContext
        from anchorage.router.config import RouterConfig
        from anchorage.router.state import RoutingState

        self.ctx = RequestContext
        self.state = RoutingState(RouterConfig(replicas=[], discovery="kubernetes",
                                               policy="agent", max_body_bytes=1 << 20))
        urls = {f"http://10.0.0.{i + 1}:8000": pod for i, pod in enumerate(PODS)}
        self.state.set_replicas(list(urls), urls)
        self.rng = random.Random(0)
        self._n = 0
        self.server = _serve(self.state.metrics.registry)
        self.port = self.server.server_address[1]
        self._loop = _Loop(self.step, 0.02)

    def step(self) -> None:
        self._n += 1
        n, rng = self._n, self.rng
        ctx = self.ctx(request_id=n, keys=[n % 7, n % 5, n], input_length=48,
                       session_id=f"s{n % 9}", agent_hint=f"agent-{n % 3}")
        d = self.state.pick(ctx)
        if d["status"] != "ok":
            self.state.rejected("saturated")
            return
        if n % 11 == 0:                       # an attempt lost, retried on another replica
            self.state.finish(ctx, d["replica"], "upstream_error")
            self.state.retried(self.state.upstreams[d["replica"]].url, "upstream_error")
            d = self.state.pick(ctx, exclude=[d["replica"]])
            if d["status"] != "ok":
                return
        usage = {"prompt_tokens": 48, "prompt_tokens_details": {
            "cached_tokens": rng.choice((0, 16, 32))}}
        self.state.finish(ctx, d["replica"], "ok", usage, d["predicted_tokens"])
        self.state.metrics_text()             # what a scrape does: the per-replica gauges
        if n % 13 == 0:
            self.state.rejected("too_large")
        if n % 97 == 0:                      # one replica ejected, then readmitted
            up = self.state.upstreams[1]
            for _ in range(self.state.cfg.eject_after_failures):
                self.state._failure(up)
            self.state._success(up)

    def close(self) -> None:
        self._loop.stop()
        self.server.shutdown()
        self.server.server_close()


# -- operator ---------------------------------------------------------------------------------

class OperatorEmitter:
    """``anchorage.operator.metrics`` recording one AgentCachePolicy's reconcile passes."""

    def __init__(self):
        from anchorage.operator import metrics as op

        self.op = op
        self._n = 0
        self.server = _serve(op.REGISTRY)
        self.port = self.server.server_address[1]
        self._loop = _Loop(self.step, 0.05)

    def step(self) -> None:
        self._n += 1
        n = self._n
        spec = {"autoscaling": {"targetHitRate": 0.5}}
        status = {"desiredReplicas": 2 + n % 2, "hitRate": 0.45}
        facts = {"observed_replicas": 2, "metrics_ok": True}
        if n % 10 == 0:
            facts["scaled"] = "up" if n % 20 == 0 else "down"
        if n % 15 == 0:
            facts["tuning"] = ("adopted", "rejected", "error")[n % 3]
        self.op.record(NAMESPACE, MODEL, spec, status, facts)
        if n % 25 == 0:
            self.op.record_error(NAMESPACE, MODEL)

    def close(self) -> None:
        self._loop.stop()
        self.server.shutdown()
        self.server.server_close()
