"""Pure parts of the stack: the drive plan (trace -> HTTP requests), the report, the port
layout, engine command lines, the Prometheus config, and the supervisor's clean stop."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from anchorage.drive.plan import PlanOptions, plan
from anchorage.drive.replay import Result
from anchorage.drive.report import markdown, summarize, table
from anchorage.trace.format import TraceRecord


def rec(ts, ids, inp, sid="s1", tool=None, agent="a", out=5, tenant=None):
    return TraceRecord(timestamp=ts, hash_ids=ids, output_length=out, input_length=inp,
                       session_id=sid, agent=agent, tool_name=tool,
                       tool_args={"path": "x.py"} if tool else None, tenant=tenant)


def test_equal_ids_give_equal_tokens_and_prefixes_are_kept():
    B = 4
    r1 = rec(0, [1, 2, 3], 12, sid="s1")
    r2 = rec(10, [1, 2, 9, 10], 15, sid="s2")
    r3 = rec(20, [1, 2, 3], 12, sid="s3", tenant="t")
    sp = {s.session: s for s in plan([r1, r2, r3], PlanOptions(block_size=B, vocab=50))}
    p1, p2, p3 = (sp[s].requests[0].body["prompt"] for s in ("s1", "s2", "s3"))
    assert len(p1) == 12 and len(p2) == 15
    assert p1[:8] == p2[:8] and p1[8:12] != p2[8:12]
    assert p3 != p1                                   # tenants never share blocks
    assert all(3 <= t < 50 for t in p1 + p2 + p3)
    again = {s.session: s for s in plan([r1, r2, r3], PlanOptions(block_size=B, vocab=50))}
    assert again["s1"].requests[0].body["prompt"] == p1     # deterministic


def test_truncation_keeps_the_prefix_and_max_tokens_is_clamped():
    r = rec(0, list(range(1, 11)), 40, out=0)
    long = plan([r], PlanOptions(block_size=4, max_prompt_tokens=100))[0].requests[0]
    short = plan([r], PlanOptions(block_size=4, max_prompt_tokens=10,
                                  max_output_tokens=3))[0].requests[0]
    assert short.body["prompt"] == long.body["prompt"][:10]
    assert short.body["max_tokens"] == 1             # output_length 0 -> at least 1
    r2 = rec(0, [1], 4, out=50)
    assert plan([r2], PlanOptions(block_size=4, max_output_tokens=3))[0].requests[0].body["max_tokens"] == 3


def test_sessions_gaps_and_metadata():
    recs = [rec(0, [1], 4, "s1", tool="read_file"), rec(1000, [5], 4, "s2"),
            rec(5000, [1, 2], 8, "s1"), rec(400_000, [1, 2, 3], 12, "s1")]
    plans = plan(recs, PlanOptions(block_size=4, time_compression=10, max_gap_s=3.0))
    assert [p.session for p in plans] == ["s1", "s2"]
    s1 = plans[0]
    assert [r.index for r in s1.requests] == [0, 2, 3]
    assert s1.requests[1].delay_s == 0.5             # 5 s / 10
    assert s1.requests[2].delay_s == 3.0             # capped
    assert plans[1].start_s == 0.1
    first = s1.requests[0]
    assert first.headers == {"x-session-id": "s1"}
    assert first.body["vllm_xargs"] == {"anchorage.tool_name": "read_file",
                                        "anchorage.tool_args": json.dumps({"path": "x.py"})}
    assert first.body["stream"] is True and first.body["stream_options"] == {"include_usage": True}
    assert "vllm_xargs" not in s1.requests[1].body
    hinted = plan(recs, PlanOptions(block_size=4, agent_hints=True))[0].requests[1]
    assert hinted.body["vllm_xargs"] == {"anchorage.agent": "a"}
    t = plan([rec(0, [1], 4, tenant="acme")], PlanOptions(block_size=4))[0].requests[0]
    assert t.headers["authorization"] == "Bearer acme"


def res(i, ok=True, prompt=100, cached=50, ttft=0.1):
    return Result(i, "s", "a", ok, 200 if ok else 500, None if ok else "boom", i * 0.1,
                  ttft if ok else None, 0.2, prompt if ok else 0, cached if ok else 0, 1)


def test_summary_counts_every_request_and_weights_hits_by_tokens():
    rs = [res(0, prompt=100, cached=0, ttft=0.1), res(1, prompt=300, cached=300, ttft=0.3),
          res(2, ok=False)]
    s = summarize(rs, wall_s=2.0, engines={"hits": 30.0, "queries": 40.0, "prompt_tokens": 0})
    assert (s["requests"], s["ok"], s["failed"]) == (3, 2, 1)
    assert s["hit_rate_usage"] == 0.75 and s["hit_rate_engines"] == 0.75
    assert s["recomputed_prefill_tokens"] == 100
    # the simulator's percentiles (linear between closest ranks) over ttfts 0.1 and 0.3
    assert s["ttft_p50_s"] == pytest.approx(0.2) and s["ttft_p90_s"] == pytest.approx(0.28)
    assert s["turns_per_s"] == 1.0 and s["errors"] == ["#2 boom"]
    none = summarize([res(0, ok=False)], wall_s=1.0)
    assert none["ttft_p50_s"] is None and none["ttft_p90_s"] is None   # JSON null
    text = table({"stock": s, "anchorage": s})
    assert "hit rate (usage)" in text and "0.750" in text
    md = markdown({"stock": s}, plots=["/x/summary.png"])
    assert "| hit rate (vLLM counters) | 0.750 |" in md and "![summary](summary.png)" in md


def test_report_files(tmp_path):
    from anchorage.drive.report import write

    rs = [res(0), res(1)]
    s = summarize(rs, 1.0)
    paths = write(tmp_path, {"a": s, "b": s}, {"a": rs, "b": rs}, "t")
    assert Path(paths["markdown"]).read_text().startswith("# t")
    assert (tmp_path / "summary.png").stat().st_size > 1000
    assert (tmp_path / "hit_rate_over_time.png").exists()
    assert len((tmp_path / "results-a.jsonl").read_text().splitlines()) == 2


def test_port_layout_and_engine_commands(tmp_path):
    from anchorage.stack.engines import EngineSpec, engine_command, sidecar_command
    from anchorage.stack import ports
    from anchorage.stack.ports import layout
    from anchorage.stack.prometheus import config_text

    p = layout(2, 20000)
    assert (p.router, p.prometheus, p.engines, p.sidecars) == (20000, 20001, (20010, 20011),
                                                              (20040, 20041))
    free = layout(3)
    assert len({x for _, x in free.all()}) == 8
    low = ports.ephemeral_low()
    if low - ports.FREE_PORT_LOW >= 100:   # free ports avoid the kernel's ephemeral range
        assert all(ports.FREE_PORT_LOW <= x < low for _, x in free.all())
    spec = EngineSpec(0, 20010, 20040, "/m", tmp_path, policy="hybrid", kv_blocks=100)
    argv, env = engine_command(spec, {"ANCHORAGE_OTHER": "x", "PATH": "/bin"})
    assert argv[1:3] == ["-m", "anchorage.stack.vllm_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--max-model-len") + 1] == str(50 * 32)
    kv = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert kv["endpoint"].startswith("ipc://")
    assert env["ANCHORAGE_POLICY"] == "hybrid" and "ANCHORAGE_OTHER" not in env
    # no CPU engine's worker pinned to a core (engines.py: a pinned busy worker starves
    # whatever else lands on its core, a restarting engine's torch import included)
    binds = {engine_command(EngineSpec(i, 1, 2, "/m", tmp_path), {})[1]
             ["VLLM_CPU_OMP_THREADS_BIND"] for i in range(3)}
    assert binds == {"nobind"}
    assert engine_command(spec, {"VLLM_CPU_OMP_THREADS_BIND": "1"})[1][
        "VLLM_CPU_OMP_THREADS_BIND"] == "1"                # the user's setting wins
    # the model runs in the engine core (no worker process spinning beside it), unless the
    # user asks for vLLM's multiprocess executor
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert engine_command(spec, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})[1][
        "VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    sargv, senv = sidecar_command(spec, {})
    assert sargv[sargv.index("--listen") + 1] == "127.0.0.1:20040"
    cfg = json.loads(config_text({"vllm": ["127.0.0.1:1"], "empty": []}))
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["vllm"]


def test_supervisor_stops_descendants_that_left_the_group(tmp_path):
    from anchorage.stack.supervisor import Supervisor, alive, descendants

    sup = Supervisor(tmp_path)
    # a child that ignores SIGTERM and a grandchild in its own session (like a daemon)
    script = ("import os, signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
              "start_new_session=True)\n"
              "print('up', flush=True)\n"
              "time.sleep(300)\n")
    c = sup.start("stubborn", [sys.executable, "-c", script])
    sup.wait_ready(c, lambda: "up" in c.log.read_text(), 30)
    deadline = time.time() + 10
    while len(descendants(c.proc.pid)) < 1 and time.time() < deadline:
        time.sleep(0.1)
    pids = [c.proc.pid, *descendants(c.proc.pid)]
    assert len(pids) == 2
    sup.remember(c)
    t0 = time.time()
    killed = sup.stop_all(grace_s=1.0)
    assert c.proc.pid in killed                       # ignored SIGTERM: escalated
    assert not any(alive(p) for p in pids)
    assert time.time() - t0 < 30


def test_anchorage_engines_get_the_scheduler_host_tier_and_cap_stock_engines_do_not(tmp_path):
    from anchorage.stack.engines import EngineSpec, engine_command

    spec = EngineSpec(0, 1, 2, "/m", tmp_path, policy="hybrid", scheduler="prefix-aware",
                      host_tier_bytes=16 << 20, long_prefill_tokens=2048)
    argv, env = engine_command(spec, {"ANCHORAGE_SCHEDULER": "fcfs"})
    assert env["ANCHORAGE_SCHEDULER"] == "prefix-aware"
    assert argv[argv.index("--long-prefill-token-threshold") + 1] == "2048"
    ktc = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert ktc["kv_connector"] == "AnchorageOffloadingConnector"
    assert ktc["kv_load_failure_policy"] == "recompute"
    ec = ktc["kv_connector_extra_config"]
    assert ec["cpu_bytes_to_use"] == 16 << 20
    assert ec["eviction_policy"] == "AnchorageCachePolicy"
    assert ec["anchorage"]["state_dir"] == str(spec.state_dir)  # the sidecar reads it there
    assert "node_pool_dir" not in ec["anchorage"]
    pooled = EngineSpec(0, 1, 2, "/m", tmp_path, policy="hybrid", host_tier_bytes=16 << 20,
                        node_pool_dir=tmp_path / "pool")
    argv, _ = engine_command(pooled, {})
    ec = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    from anchorage.node_agent.offload.config import OffloadConfig

    assert OffloadConfig.from_extra_config(ec).node_pool_dir == str(tmp_path / "pool")
    # stock engines (policy off) stay stock: neither, whatever the stack asks
    stock = EngineSpec(0, 1, 2, "/m", tmp_path, policy="off", scheduler="prefix-aware",
                       host_tier_bytes=16 << 20, long_prefill_tokens=2048)
    argv, env = engine_command(stock, {"ANCHORAGE_SCHEDULER": "prefix-aware"})
    assert "--kv-transfer-config" not in argv and "ANCHORAGE_SCHEDULER" not in env
    assert "--long-prefill-token-threshold" not in argv
    # the defaults: vLLM's FCFS order, no host tier, no prefill cap
    argv, env = engine_command(EngineSpec(0, 1, 2, "/m", tmp_path), {})
    assert "--kv-transfer-config" not in argv and "ANCHORAGE_SCHEDULER" not in env
    assert "--long-prefill-token-threshold" not in argv


def test_the_stack_flags_reach_the_engine_specs_and_bad_values_are_clear(tmp_path):
    import argparse

    from anchorage.cli import CLIError
    from anchorage.commands.up import add_stack_args, stack_config

    p = argparse.ArgumentParser()
    add_stack_args(p)
    p.add_argument("--router-params", default="{}")
    cfg = stack_config(p.parse_args(["--scheduler", "prefix-aware", "--host-tier-mb", "32",
                                     "--long-prefill-tokens", "512"]))
    assert (cfg.scheduler, cfg.host_tier_mb, cfg.long_prefill_tokens) == ("prefix-aware", 32, 512)
    cfg = stack_config(p.parse_args([]))
    assert (cfg.scheduler, cfg.host_tier_mb, cfg.long_prefill_tokens) == ("", 0, 0)
    with pytest.raises(CLIError, match="--host-tier-mb must be >= 0"):
        stack_config(p.parse_args(["--host-tier-mb", "-1"]))
    cfg = stack_config(p.parse_args(["--host-tier-mb", "32", "--node-pool"]))
    assert cfg.node_pool and not stack_config(p.parse_args(["--host-tier-mb", "32"])).node_pool
    with pytest.raises(CLIError, match="--node-pool needs --host-tier-mb"):
        stack_config(p.parse_args(["--node-pool"]))
    with pytest.raises(CLIError, match="--long-prefill-tokens must be >= 0"):
        stack_config(p.parse_args(["--long-prefill-tokens", "-1"]))
    with pytest.raises(SystemExit):
        p.parse_args(["--scheduler", "sjf"])
    from anchorage.stack.stack import StackConfig
    with pytest.raises(ValueError, match="--scheduler must be one of fcfs, prefix-aware"):
        StackConfig(scheduler="sjf").validate()


def test_the_router_spec_hosting_and_tokenizer(tmp_path):
    """``--router-hosting`` reaches router_main's config (``hosting``, which it runs; the
    one-process router itself: tests/router/test_hosting_process.py), and the router gets
    the model's tokenizer (and the engines' KV events) only for precise_prefix."""
    import argparse

    from anchorage.commands.up import add_stack_args, stack_config
    from anchorage.stack.engines import EngineSpec
    from anchorage.stack.stack import StackConfig, router_spec
    from anchorage.stack.tiny_model import write_model

    model = write_model(tmp_path / "m", "chat")
    specs = [EngineSpec(i, 20 + i, 30 + i, str(model), tmp_path, tokenizer=True)
             for i in range(2)]
    p = argparse.ArgumentParser()
    add_stack_args(p)
    p.add_argument("--router-params", default="{}")
    assert stack_config(p.parse_args([])).router_hosting == "ray"
    cfg = stack_config(p.parse_args(["--router-hosting", "process"]))
    spec = router_spec(cfg, specs, 8000, dummy=True)
    assert spec["hosting"] == "process" and spec["router"]["policy"] == "agent"
    assert spec["router"]["tokenizer"] == "" and spec["router"]["kv_events"] == {}
    exact = router_spec(StackConfig(router="precise_prefix"), specs, 8000, dummy=True)
    assert exact["hosting"] == "ray" and exact["router"]["tokenizer"] == str(model)
    assert set(exact["router"]["kv_events"]) == {s.url for s in specs}
    with pytest.raises(SystemExit):
        p.parse_args(["--router-hosting", "k8s"])
    with pytest.raises(ValueError, match="--router-hosting must be one of ray, process"):
        StackConfig(router_hosting="k8s").validate()


def test_metrics_parsers():
    from anchorage.drive.metrics import delta, parse, parse_node_agent

    v = parse('# HELP x\nvllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 64.0\n'
              'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 100.0\n'
              'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n')
    assert v["hits"] == 64.0 and v["queries"] == 100.0 and v["external_hits"] == 0.0
    # the host tier's hits (through the KV connector) count as hits too: not recomputed
    ext = parse('vllm:prefix_cache_hits_total{engine="0"} 40.0\n'
                'vllm:external_prefix_cache_hits_total{engine="0"} 24.0\n'
                'vllm:prefix_cache_queries_total{engine="0"} 100.0\n')
    assert ext["external_hits"] == 24.0
    assert summarize([], 1.0, engines=ext)["hit_rate_engines"] == pytest.approx(0.64)
    na = parse_node_agent('anchorage_policy_errors_total{model_name="tiny",policy="hybrid"} 5.0\n'
                          'anchorage_warmups_total{model_name="tiny",outcome="issued"} 2.0\n'
                          'anchorage_warmups_total{model_name="tiny",outcome="used"} 1.0\n')
    assert na["policy_errors"] == 5.0 and na["warmups_issued"] == 2.0 and na["warmups_used"] == 1.0
    assert delta({"hits": 1.0}, {"hits": 3.0, "queries": 2.0}) == {"hits": 2.0, "queries": 2.0}
    assert delta(None, {"hits": 1.0}) is None


def test_free_port_outside_the_ephemeral_range(tmp_path, monkeypatch):
    import random
    import socket

    from anchorage.stack import ports

    rng = random.Random(3)
    taken = ports.free_port(rng=random.Random(3))
    with socket.socket() as s:              # the port drawn first is busy: the next is used
        s.bind(("127.0.0.1", taken))
        s.listen()
        port = ports.free_port(rng=rng)
        assert port != taken and ports.is_free(port)
    rng_file = tmp_path / "range"
    rng_file.write_text("40000\t60999\n")
    assert ports.ephemeral_low(str(rng_file)) == 40000
    assert ports.ephemeral_low(str(tmp_path / "missing")) == 32768
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 40000)
    assert 20000 <= ports.free_port() < 40000
    monkeypatch.setattr(ports, "ephemeral_low", lambda: 20050)   # no room: the kernel chooses
    assert ports.free_port() >= 1024
