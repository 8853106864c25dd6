"""The sidecar against a fake engine (HTTP + ZMQ on loopback/ipc) and snapshots written by
the real exporter: warm-ups issued, gated, used and wasted; metrics; health; access log
(fetched the way the operator's tuner fetches it); config reload; shutdown."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from anchorage.access_log import AccessLogConfig
from anchorage.policies.base import EvictionPolicy, RequestContext
from anchorage.warmup import WarmupConfig
from anchorage.node_agent.sidecar import (Sidecar, SidecarConfig, parse_engine_load,
                                          read_config_file)
from anchorage.node_agent.state import NodeState, PolicyStateExporter
from tests.node_agent.fake_engine import FakeEngine, removed, stored

BS = 4
A_TOKS = list(range(1, 9))          # agent a's anchor: 2 blocks
B_TOKS = list(range(101, 109))


class Stub:
    """What a policy would report, changed by the test between ticks."""

    def __init__(self):
        self.view = {"policy": "hybrid", "predictability": 0.9, "predictions": [],
                     "anchors": [], "block_size": BS}

    def __call__(self):
        return self.view

    def anchor(self, agent, toks, last_seen_s=0.0):
        self.view["anchors"] = [a for a in self.view["anchors"] if a["agent"] != agent] + [
            {"agent": agent, "hint": agent.upper(), "token_ids": toks, "first_s": 0.0,
             "last_seen_s": last_seen_s, "requests": 1}]


def metric(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def until(pred, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def env(tmp_path):
    eng = FakeEngine(f"ipc://{tmp_path}/kv.ipc")
    yield eng, tmp_path
    eng.close()


def make(tmp_path, eng, **kw):
    warm = kw.pop("warmup", WarmupConfig(cooldown_s=3600, rate_per_s=100, burst=100,
                                         min_probability=0.2))
    return Sidecar(SidecarConfig(
        engine_url=eng.url, kv_events=f"ipc://{tmp_path}/kv.ipc", state_dir=str(tmp_path),
        port=0, tick_s=0.05, snapshot_max_age_s=2.0, policy_env="hybrid", warmup=warm,
        access_log=AccessLogConfig(sample_rate=1.0, block_size=BS), **kw))


def test_warmups_issued_used_wasted_and_metrics(env):
    eng, tmp = env
    stub = Stub()
    exp = PolicyStateExporter(stub, tmp / "state.json", interval_s=0.05, policy_name="hybrid")

    # the engine caches what a warm-up prefills (as vLLM does) and announces it
    def cache(body):
        toks = body["prompt"]
        h = [bytes([toks[0], i]) for i in range(len(toks) // BS)]
        eng.publish([stored(h, None, toks, BS)])
    eng.on_completion = cache

    async def main():
        sc = make(tmp, eng)
        await sc.start()
        loop = asyncio.create_task(sc.run_loop())
        base = f"http://127.0.0.1:{sc.port}"
        async with httpx.AsyncClient() as c:
            # no snapshot yet: not ready, no warm-up
            await until(lambda: sc.ticks >= 2, "ticks")
            r = await c.get(base + "/readyz")
            assert r.status_code == 503 and "snapshot" in r.text
            assert (await c.get(base + "/healthz")).status_code == 200

            # a predicted agent with a known anchor, gate open, idle engine -> warm-up
            stub.anchor("fp:a", A_TOKS)
            stub.view["predictions"] = [{"agent": "fp:a", "probability": 0.9},
                                        {"agent": "fp:lowp", "probability": 0.05}]
            exp.start()
            await until(lambda: len(eng.completions) == 1, "a warm-up")
            body = eng.completions[0]
            assert body["prompt"] == A_TOKS and body["max_tokens"] == 1
            assert body["model"] == "tiny"
            assert body["vllm_xargs"] == {"anchorage.warmup": 1, "anchorage.agent": "FP:A"}
            assert (await c.get(base + "/readyz")).status_code == 200
            # its blocks are now cached (KV events): not warmed again, still pending
            await until(lambda: sc.tracker.batches >= 1, "the stored event")
            await asyncio.sleep(0.3)
            assert len(eng.completions) == 1 and sc.ledger.used == 0

            # a real request of agent a arrives (the plugin stamps the anchor) -> used
            stub.anchor("fp:a", A_TOKS, last_seen_s=time.time())
            await until(lambda: sc.ledger.used == 1, "warm-up used")

            # agent b warmed, then its anchor is evicted before any request -> wasted
            stub.anchor("fp:b", B_TOKS)
            stub.view["predictions"] = [{"agent": "fp:b", "probability": 0.8}]
            await until(lambda: len(eng.completions) == 2, "warm-up of b")
            await until(lambda: "fp:b" in sc.ledger.pending, "b pending")
            eng.publish([removed([bytes([B_TOKS[0], 1])])])
            await until(lambda: sc.ledger.wasted == 1, "warm-up wasted")

            # a busy engine gets no warm-up: skipped (counted once per agent and cooldown).
            # The sidecar reads c's prediction before the engine turns busy: a busy engine
            # skips every predicted agent, and a tick still reading b's prediction would
            # count b too. c's anchor is unknown until then, so it is not warmed meanwhile.
            stub.view["predictions"] = [{"agent": "fp:c", "probability": 0.8}]
            await until(lambda: [a for a, _ in sc.snapshot.predictions] == ["fp:c"],
                        "c predicted")
            eng.running = 5
            stub.anchor("fp:c", [7] * 8)
            await until(lambda: sc.warmups["skipped"] >= 1, "skip")
            await asyncio.sleep(0.3)
            assert len(eng.completions) == 2 and sc.warmups["skipped"] == 1

            # an unpredictable workload: the gate stays closed even when idle
            stub.view["predictability"] = 0.1
            await until(lambda: sc.snapshot.predictability == 0.1, "R = 0.1 read")
            eng.running = 0
            await asyncio.sleep(0.3)
            assert len(eng.completions) == 2

            # a failing engine: counted, not fatal
            stub.view["predictability"] = 0.9
            eng.fail_completions = True
            await until(lambda: sc.warmups["failed"] == 1, "failed warm-up")

            text = (await c.get(base + "/metrics")).text
            assert metric(text, "anchorage_warmups_total", outcome="issued") == 3
            assert metric(text, "anchorage_warmups_total", outcome="used") == 1
            assert metric(text, "anchorage_warmups_total", outcome="wasted") == 1
            assert metric(text, "anchorage_warmups_total", outcome="failed") == 1
            assert metric(text, "anchorage_warmups_total", outcome="skipped") == 1
            assert metric(text, "anchorage_policy_info", model_name="tiny", policy="hybrid",
                          mode="active") == 1
            assert metric(text, "anchorage_predictability_ratio") == 0.9
            # stock engine view of evictions: every KV-event removal, reason lru
            assert metric(text, "anchorage_evictions_total", reason="lru") == 1
            for name in ("anchorage_config_generation", "anchorage_evictions_reused_total",
                         "anchorage_protected_blocks", "anchorage_next_agent_predictions_total",
                         "anchorage_policy_errors_total", "anchorage_policy_decision_seconds_count",
                         "anchorage_access_log_records_total"):
                assert metric(text, name) is not None, name

            # the snapshot goes stale (plugin gone): not ready, no warm-ups
            exp.stop()
            await until(lambda: not sc.fresh(), "stale snapshot", timeout_s=10)
            r = await c.get(base + "/readyz")
            assert r.status_code == 503
            assert (await c.get(base + "/nope")).status_code == 404
        sc.request_stop()
        await loop
        await sc.stop()

    asyncio.run(main())


def test_access_log_config_reload_and_graceful_stop(env, monkeypatch):
    eng, tmp = env
    state = NodeState(block_size=BS)

    for i in range(6):
        keys = [bytes([i, j]) for j in range(3)]
        ctx = RequestContext(request_id=f"r{i}", keys=keys, input_length=3 * BS + 1,
                             output_length=5, session_id=f"s{i % 2}", tool_name="grep",
                             agent_hint="coder")
        state.observe(EvictionPolicy(), ctx, None, now_s=1000.0 + i)  # learns nothing
    ctx = RequestContext(request_id="w", keys=[b"w"], input_length=BS, warmup=True)
    state.observe(EvictionPolicy(), ctx, None)  # warm-ups are not workload
    in_force = {"generation": 3}   # what the plugin applied (it may refuse a newer file)
    exp = PolicyStateExporter(lambda: {"policy": "lru"}, tmp / "state.json", interval_s=0.05,
                              node_state=state, config_generation=lambda: in_force["generation"])
    cfg = tmp / "anchorage.yaml"
    cfg.write_text("generation: 3\npolicy: {name: hybrid, parameters: {prefetch: {enabled: false},"
                   " horizon: 60}}\n...\n")

    async def main():
        sc = make(tmp, eng, config_path=str(cfg))
        await sc.start()                       # writes the sample rate for the plugin
        exp.start()
        serve = asyncio.create_task(sc.run_loop())
        base = f"http://127.0.0.1:{sc.port}"
        await until(lambda: sc.access_log.kept == 6, "6 access-log records")
        assert sc.config_generation == 3 and sc.scheduler.config.enabled is False
        async with httpx.AsyncClient() as c:
            text = (await c.get(base + "/metrics")).text
            assert metric(text, "anchorage_config_generation") == 3
            assert metric(text, "anchorage_access_log_records_total") == 6
        # the operator's tuner fetches it over HTTP and reads it as a v1 trace
        from anchorage.operator.access_logs import load_access_logs

        recs = await asyncio.to_thread(load_access_logs, [base + "/access-log"], max_requests=100)
        assert len(recs) == 6
        assert {r.session_id for r in recs} == {"s0", "s1"}
        assert all(len(r.hash_ids) == 3 and r.tool_name == "grep" and r.agent == "coder"
                   for r in recs)
        assert [r.timestamp for r in recs] == [0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]
        # a changed config is re-read
        cfg.write_text("generation: 4\npolicy: {name: hybrid, parameters: {rMin: 0.5}}\n...\n")
        await until(lambda: sc.config_generation == 4, "config generation 4")
        assert sc.scheduler.config.enabled is True and sc.scheduler.config.r_min == 0.5
        # the metric reports what the engine runs: 3 until its plugin applies 4
        async with httpx.AsyncClient() as c:
            assert metric((await c.get(base + "/metrics")).text, "anchorage_config_generation") == 3
            in_force["generation"] = 4
            await asyncio.sleep(0.3)  # the exporter rewrites state.json every 0.05 s
            await until(lambda: sc.snapshot is not None and sc.snapshot.config_generation == 4,
                        "engine generation 4 read")
            assert metric((await c.get(base + "/metrics")).text, "anchorage_config_generation") == 4
        # drain empties the buffer
        async with httpx.AsyncClient() as c:
            r = await c.get(base + "/v1/access-log?drain=1")
            assert r.text.count("\n") == 7   # header + 6 records
            r = await c.get(base + "/v1/access-log")
            assert r.text.count("\n") == 1
        sc.request_stop()
        await serve
        await sc.stop()
        exp.stop()

    asyncio.run(main())


def test_pure_helpers(tmp_path):
    assert parse_engine_load('vllm:num_requests_running{model_name="m"} 3.0\n'
                             'vllm:num_requests_waiting{model_name="m"} 1.0\n'
                             '# HELP vllm:num_requests_running x\n') == (3, 1)
    p = tmp_path / "c.yaml"
    p.write_text("generation: 2\npolicy: {name: hybrid, parameters: {horizon: 30, rMin: 0.4, "
                 "prefetch: {enabled: true, ratePerSecond: 1}}}\n...\n")
    assert read_config_file(str(p)) == (2, {"r_min": 0.4, "enabled": True, "rate_per_s": 1.0})
    p.write_text("generation: 2\npolicy: {name: hybrid, parameters: {warmup: {rate_per_s: 1}}}\n"
                 "...\n")
    with pytest.raises(ValueError, match="policy.parameters.warmup: unknown parameter"):
        read_config_file(str(p))
    with pytest.raises(ValueError, match="engine URL"):
        SidecarConfig(engine_url="localhost:8000")
    with pytest.raises(ValueError, match="KV events"):
        SidecarConfig(kv_events="/tmp/x.ipc")


def test_readiness_without_a_plugin_snapshot(tmp_path):
    sc = Sidecar(SidecarConfig(state_dir=str(tmp_path), policy_env="hybrid",
                               snapshot_grace_s=30.0))
    assert sc.ready() == (False, "engine not answering")
    sc.engine_ok, sc._engine_up_s = True, 1000.0
    ok, why = sc.ready(now_s=1010.0)
    assert not ok and "no fresh plugin snapshot" in why
    ok, why = sc.ready(now_s=1031.0)        # the plugin never wrote: vLLM runs stock
    assert ok and "stock" in why
    sc_off = Sidecar(SidecarConfig(state_dir=str(tmp_path), policy_env="off"))
    sc_off.engine_ok = True
    assert sc_off.ready() == (True, "ok")

