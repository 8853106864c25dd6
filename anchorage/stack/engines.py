"""Command lines for one vLLM engine (the OpenAI server, CPU build or GPU) and its
node-agent sidecar. Pure: plain data in, ``(argv, env)`` out.

Engine defaults for the CPU demo (ENVIRONMENT.md): tiny Llama with dummy weights, token-id
prompts, eager mode, prefix caching, block size 32, a small KV pool
(``num_gpu_blocks_override``) so eviction decides the hit rate, KV events on an ``ipc://``
socket (never ``tcp://*``), ``--enable-prompt-tokens-details`` (``cached_tokens`` in usage),
and ``VLLM_HOST_IP=127.0.0.1``: without it vLLM finds "its" address by connecting a UDP
socket to 8.8.8.8 (``vllm.utils.network_utils.get_ip``), and its engine core and workers
talk over that address.
The engine runs through ``python -m anchorage.stack.vllm_server``, which registers the
Anchorage plugin before vLLM starts; ``ANCHORAGE_POLICY`` picks the eviction policy (``off``:
stock vLLM, nothing patched). An Anchorage engine (policy not ``off``) may also get the
prefix-aware scheduler (``scheduler``: ``ANCHORAGE_SCHEDULER``), a host-memory KV tier
(``host_tier_bytes``: ``--kv-transfer-config`` from
``anchorage.node_agent.offload.config.transfer_config``, what the chart's ``hostTier``
renders; ``node_pool_dir``: the node pool's directory, the chart's ``hostTier.nodePool``)
and a cap on one prefill chunk per step (``long_prefill_tokens``: vLLM's
``--long-prefill-token-threshold``, the chart's ``longPrefillTokens``); a stock engine
never does."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from anchorage.stack.tiny_model import TINY_LLAMA


@dataclass(frozen=True)
class EngineSpec:
    index: int
    port: int
    sidecar_port: int
    model: str
    workdir: Path                      # per-engine: state dir, KV socket, home
    policy: str = "hybrid"             # ANCHORAGE_POLICY; "off" = stock vLLM
    served_name: str = "tiny"
    block_size: int = 32
    kv_blocks: int = 512               # num_gpu_blocks_override (0: vLLM sizes the pool)
    kv_cache_bytes: int = 64 << 20
    max_model_len: int = 0             # 0: (kv_blocks // 2) * block_size
    dummy: bool = True                 # dummy weights (the tiny model)
    tokenizer: bool = False            # the model directory has a tokenizer (tiny "chat")
    cpu: bool = True                   # CPU build: eager mode, one OpenMP thread
    warmup: bool = True                # node-agent warm-ups
    scheduler: str = ""                # ANCHORAGE_SCHEDULER ("" / fcfs: vLLM's order)
    host_tier_bytes: int = 0           # host-memory KV tier (Anchorage's connector); 0: none
    node_pool_dir: Path | None = None  # the node pool's directory (with the host tier)
    long_prefill_tokens: int = 0       # --long-prefill-token-threshold; 0: none (vLLM's)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"

    @property
    def kv_endpoint(self) -> str:
        return f"ipc://{self.workdir}/kv.ipc"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    def model_len(self) -> int:
        """``max_model_len``, else half the pool, at most the tiny model's positions."""
        if self.max_model_len:
            return self.max_model_len
        return min(max(self.block_size, (self.kv_blocks // 2) * self.block_size),
                   TINY_LLAMA["max_position_embeddings"])


def engine_command(spec: EngineSpec, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, "-m", "anchorage.stack.vllm_server", "--model", spec.model,
            "--served-model-name", spec.served_name, "--enable-prefix-caching",
            "--block-size", str(spec.block_size), "--enable-prompt-tokens-details",
            "--host", "127.0.0.1", "--port", str(spec.port),
            "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                              "endpoint": spec.kv_endpoint, "topic": "kv"})]
    if spec.dummy:
        argv += ["--load-format", "dummy"]
        if not spec.tokenizer:
            argv.append("--skip-tokenizer-init")
    if spec.cpu:
        argv.append("--enforce-eager")
    if spec.kv_blocks:   # a fixed, small pool (the tiny model): eviction decides hit rates
        if spec.cpu:     # otherwise start-up fails vLLM's CPU memory check
            argv += ["--kv-cache-memory-bytes", str(spec.kv_cache_bytes)]
        argv += ["--num-gpu-blocks-override", str(spec.kv_blocks),
                 "--max-model-len", str(spec.model_len())]
    elif spec.max_model_len:
        argv += ["--max-model-len", str(spec.max_model_len)]
    anchorage_on = spec.policy != "off"
    if spec.host_tier_bytes and anchorage_on:
        # the chart's hostTier (backend and policy anchorage): every computed prompt block
        # is copied to host memory and loaded back at admission instead of recomputed
        from anchorage.node_agent.offload.config import transfer_config

        anch = {"state_dir": str(spec.state_dir)}
        if spec.node_pool_dir is not None:
            anch["node_pool_dir"] = str(spec.node_pool_dir)
        argv += ["--kv-transfer-config", json.dumps(transfer_config(
            spec.host_tier_bytes, anchorage=anch))]
    if spec.long_prefill_tokens and anchorage_on:
        argv += ["--long-prefill-token-threshold", str(spec.long_prefill_tokens)]
    env = {k: v for k, v in base_env.items() if not k.startswith("ANCHORAGE_")}
    env.update(ANCHORAGE_POLICY=spec.policy, ANCHORAGE_STATE_DIR=str(spec.state_dir),
               VLLM_NO_USAGE_STATS="1", VLLM_WORKER_MULTIPROC_METHOD="fork",
               VLLM_HOST_IP="127.0.0.1",
               HOME=str(spec.workdir / "home"))
    if spec.scheduler and anchorage_on:
        env["ANCHORAGE_SCHEDULER"] = spec.scheduler
    if spec.cpu:
        env.setdefault("OMP_NUM_THREADS", "1")
        # No engine is pinned to a core. vLLM's CPU worker pins its threads by default
        # ("auto": every engine of the stack on the first core), and a worker serving
        # requests spins on its queue (sched_yield) all the time: a process pinned to the
        # same core next to it gets almost no CPU (measured: 0.2 s of CPU in 100 s).
        # Pinning each engine to its own core (the previous setting) was not enough: every
        # process that imports torch pins itself to each core in turn while cpuinfo reads
        # it (`strace`: [0] ... [1] ... [0 1]), so a restarting engine stalled on core 0
        # behind engine 0's worker for as long as requests kept it busy (the restart
        # "hung" under load and came up in 24 s once the load stopped). Unpinned, the
        # kernel moves the busy worker away. The chart's CPU values do the same.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # The model runs in the engine core process (vLLM's one-process executor, what a
        # GPU engine at tensor parallel 1 runs), not in a worker process of its own: on the
        # CPU build vLLM otherwise starts a worker per engine, and the engine core and the
        # worker each spin (sched_yield) for a second after every message they exchange.
        # With every engine's processes on the same few cores that spin is the largest
        # term of TTFT (two engines on 2 cores: TTFT p50 about 65 -> 35 ms, p90 about
        # 300 -> 80 ms, CPU per turn 140 -> 50 ms, the same for every stack). A user's
        # VLLM_ENABLE_V1_MULTIPROCESSING=1 keeps vLLM's own choice (the fault tests do).
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return argv, env


def sidecar_command(spec: EngineSpec, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    argv = [sys.executable, "-m", "anchorage.cli", "node-agent", "--engine-url", spec.url,
            "--kv-events", spec.kv_endpoint, "--kv-topic", "kv",
            "--state-dir", str(spec.state_dir), "--listen", f"127.0.0.1:{spec.sidecar_port}",
            "--model-name", spec.served_name]
    if not spec.warmup:
        argv.append("--no-warmup")
    env = {k: v for k, v in base_env.items() if not k.startswith("ANCHORAGE_")}
    env["ANCHORAGE_POLICY"] = spec.policy
    return argv, env


# vllm-cpu 0.32's AMX attention kernel (bf16, block sizes of 32: what the tiny engines run)
# dies of SIGILL when an engine's *first* request is a prompt of a few tokens (measured on a
# Sapphire-Rapids-class host: 4 tokens first, always; 16 or more first, never; any length
# afterwards, never). One request of PRIME_TOKENS before the engine counts as ready
# (and after each restart: the supervisor reuses the ready check) keeps a user's "hi" from
# killing it. Before any run's counters are read, so no reported hit rate includes it.
PRIME_TOKENS = list(range(3, 67))


def prime(url: str, served_name: str, timeout_s: float = 30.0) -> bool:
    """One ``max_tokens=1`` completion of ``PRIME_TOKENS`` (token ids below any vocabulary's
    size); True when the engine answered it."""
    import urllib.request

    body = json.dumps({"model": served_name, "prompt": PRIME_TOKENS, "max_tokens": 1}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - loopback
            return r.status == 200
    except OSError:
        return False
