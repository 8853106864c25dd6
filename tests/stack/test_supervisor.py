"""The stack's supervision over real processes (fast; no vLLM, no Ray): the restart
policy's specification, exit statuses in words, a dead child's whole process tree reaped
(an engine-core-like grandchild that ignores SIGTERM included), restarts with back-off
that become ready again, giving up, and the engine wrapper's exit status for a dead
engine core.

The children are small Python HTTP servers on loopback standing in for an engine: what is
under test is the supervisor (the real engines' faults are in ``test_stack_faults``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from anchorage.stack.restart import AUX, ENGINE, ROUTER, RestartPolicy, can_serve
from anchorage.stack.supervisor import (GIVEN_UP, RUNNING, Supervisor, alive, describe_exit,
                                        http_ok)
from tests.conftest import REPO
from tests.support.procs import free_port

# an engine stand-in: /health on PORT; a grandchild in its process group that ignores
# SIGTERM (vLLM's busy engine core does); exits 3 at start while FAIL_FILE exists
# the end of every child script: answer 200 "ok" on 127.0.0.1:port
SERVE_OK = textwrap.dedent("""
    import http.server
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")

CHILD = textwrap.dedent("""
    import os, signal, subprocess, sys
    port, fail_file, pid_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if os.path.exists(fail_file):
        sys.exit(3)
    core = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(pid_file, "w").write(str(core.pid))
""") + SERVE_OK


def run_until(sup: Supervisor, pred, timeout_s: float = 30.0) -> list[str]:
    events: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events += sup.tick()
        if pred():
            return events
        time.sleep(0.05)
    raise AssertionError(f"condition not reached in {timeout_s} s; events: {events}")


@pytest.fixture
def engine_like(tmp_path):
    sup = Supervisor(tmp_path / "logs", RestartPolicy(backoff_s=0.3, backoff_max_s=0.6,
                                                      max_restarts=2, stable_s=300),
                     reap_s=1.0)
    port = free_port()
    fail, pid_file = tmp_path / "fail", tmp_path / "core.pid"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    c = sup.start("engine-0", [sys.executable, str(script), str(port), str(fail), str(pid_file)],
                  role=ENGINE)
    sup.wait_ready(c, lambda: http_ok(f"http://127.0.0.1:{port}/health"), 30)
    yield sup, c, port, fail, pid_file
    sup.stop_all(grace_s=2, straggler_s=1)


def test_restart_policy_specification():
    p = RestartPolicy()
    assert [p.delay_s(k) for k in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert not p.gives_up(5) and p.gives_up(6)
    assert RestartPolicy(max_restarts=0).gives_up(1)
    assert RestartPolicy.from_dict({"backoff_s": 0.5}).backoff_s == 0.5
    with pytest.raises(ValueError, match="unknown restart parameter.*backof"):
        RestartPolicy.from_dict({"backof": 1})
    with pytest.raises(ValueError):
        RestartPolicy(backoff_s=10, backoff_max_s=1)
    assert can_serve([(ROUTER, False), (ENGINE, True), (ENGINE, False), (AUX, True)])
    assert not can_serve([(ROUTER, False), (ENGINE, True), (AUX, False)])
    assert not can_serve([(ROUTER, True), (ENGINE, False)])
    # a restart gets a few times the first start's time, within the configured timeout
    assert p.restart_timeout_s(None, 600) == 600
    assert p.restart_timeout_s(75, 600) == 300 and p.restart_timeout_s(10, 600) == 120
    assert p.restart_timeout_s(200, 600) == 600
    # each restart in a row that was not ready gets twice the time, within the timeout
    assert [p.restart_timeout_s(10, 600, k) for k in range(4)] == [120, 240, 480, 600]
    with pytest.raises(ValueError, match="hung_start_factor"):
        RestartPolicy(hung_start_factor=0.5)


def test_exit_status_in_words():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(1) == "exited with status 1"
    assert describe_exit(0) == "exited with status 0"
    assert describe_exit(137) == "exited with status 137 (a process it ran was killed by SIGKILL)"


def test_dead_child_is_reaped_with_its_tree_and_restarted(engine_like):
    sup, c, port, _, pid_file = engine_like
    first_pid, core = c.proc.pid, int(pid_file.read_text())
    assert alive(core)
    os.kill(first_pid, signal.SIGKILL)              # the API server, killed outright
    events = run_until(sup, lambda: c.state == RUNNING and c.proc.pid != first_pid)
    assert events[0].startswith("engine-0 was killed by SIGKILL; restarting it in 0.3 s"), events
    assert any("left behind needed SIGKILL" in e for e in events), events  # it ignored SIGTERM
    assert not alive(core)                          # reaped before the restart
    assert any(e.startswith("engine-0 is back (restart 1") for e in events), events
    assert http_ok(f"http://127.0.0.1:{port}/health")
    assert int(pid_file.read_text()) != core and c.restarts == 1 and c.failures == 1


def test_back_off_grows_then_gives_up_and_nothing_can_serve(engine_like):
    sup, c, _, fail, pid_file = engine_like
    core = int(pid_file.read_text())
    fail.write_text("1")                            # every restart now exits 3 at once
    os.kill(c.proc.pid, signal.SIGKILL)
    events = run_until(sup, lambda: c.state == GIVEN_UP)
    deaths = [e for e in events if e.startswith("engine-0 ") and ";" in e]
    assert deaths[0].startswith("engine-0 was killed by SIGKILL; restarting it in 0.3 s")
    assert deaths[1].startswith("engine-0 exited with status 3; restarting it in 0.6 s")
    assert deaths[2].startswith("engine-0 exited with status 3; giving up after 2 failed "
                                "restart(s); it stays down"), deaths
    assert not alive(core)
    assert not can_serve((ch.role, ch.given_up) for ch in sup.children)
    assert sup.tick() == []                         # given up: no more restarts


def test_a_stable_child_starts_over_from_the_first_delay(tmp_path):
    sup = Supervisor(tmp_path, RestartPolicy(backoff_s=0.2, stable_s=0.5), reap_s=0.5)
    c = sup.start("prometheus", [sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(c.proc.pid, signal.SIGTERM)
        run_until(sup, lambda: c.state == RUNNING and c.restarts == 1)
        assert c.failures == 1
        run_until(sup, lambda: c.failures == 0, timeout_s=5)   # ready for stable_s
        os.kill(c.proc.pid, signal.SIGTERM)
        events = run_until(sup, lambda: c.restarts == 2)
        assert "was killed by SIGTERM; restarting it in 0.2 s" in events[0], events
    finally:
        sup.stop_all(grace_s=2, straggler_s=1)


def test_stop_all_stops_a_restarting_supervisor_cleanly(engine_like):
    sup, c, _, _, pid_file = engine_like
    core = int(pid_file.read_text())
    os.kill(c.proc.pid, signal.SIGKILL)
    sup.tick()
    sup.stop_all(grace_s=1, straggler_s=1)
    assert not alive(core) and sup.children == [] and sup.tick() == []


WRAPPER_PROBE = textwrap.dedent("""
    import json, multiprocessing as mp, os, signal, sys, time
    from anchorage.stack import vllm_server as vs
    vs._record_started_processes()
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    def wait():
        time.sleep(60)
    ctx = mp.get_context("fork")
    stopped = ctx.Process(target=wait, name="Stopped"); stopped.start()
    stopped.terminate(); stopped.join()                # an orderly stop: not a failure
    before = vs.failed_child_status()
    core = ctx.Process(target=die, name="EngineCore"); core.start()
    from multiprocessing.connection import wait as wait_for_exit
    wait_for_exit([core.sentinel])
    core.terminate()     # what vLLM's shutdown does when is_alive() ran before the zombie
    core.join()
    print(json.dumps([before, vs.failed_child_status()]))
""")


def test_engine_wrapper_reports_a_dead_engine_core():
    p = subprocess.run([sys.executable, "-c", WRAPPER_PROBE], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    before, after = json.loads(p.stdout)
    assert before is None
    assert after[0] == 137 and after[1].startswith("EngineCore (pid ")
    assert after[1].endswith("was killed by SIGKILL")


def test_stack_reports_when_nothing_can_serve(tmp_path):
    """The watcher keeps a stack with a dead engine up while it restarts, and says so
    once restarts gave up on its only engine (``anchorage up`` then exits)."""
    from anchorage.stack.stack import Stack, StackConfig

    stack = Stack(StackConfig(engines=1, prometheus="off", workdir=str(tmp_path),
                              restart=RestartPolicy(backoff_s=0.2, backoff_max_s=0.2,
                                                    max_restarts=1)))
    lines: list[str] = []
    try:
        stack.sup.start("router", [sys.executable, "-c", "import time; time.sleep(600)"],
                        role=ROUTER)
        engine = stack.sup.start("engine-0", [sys.executable, "-c", "import sys; sys.exit(4)"],
                                 role=ENGINE)
        stack.watch(lines.append)
        deadline = time.monotonic() + 30
        while stack.check() is None and time.monotonic() < deadline:
            assert stack.can_serve() or engine.given_up
            time.sleep(0.05)
        problem = stack.check()
        assert problem and problem.startswith("nothing can serve any more: engine-0 exited "
                                              "with status 4"), (problem, lines)
        assert any("giving up after 1 failed restart(s)" in ln for ln in lines), lines
    finally:
        stack.stop()
    assert stack.sup.children == []


# serves on PORT, except while HANG_FILE holds a count above 0: such a start takes one off,
# says where it is in its log, and never answers
HANGING = textwrap.dedent("""
    import os, sys, time
    port, hang_file = int(sys.argv[1]), sys.argv[2]
    n = int(open(hang_file).read()) if os.path.exists(hang_file) else 0
    if n > 0:
        open(hang_file, "w").write(str(n - 1))
        print("waiting for the worker to come up", flush=True)
        time.sleep(600)
""") + SERVE_OK


def test_a_hung_restart_is_restarted_after_a_multiple_of_the_first_start(tmp_path):
    """A restart that is not ready within ``hung_start_factor`` x the first start's time
    (and ``hung_start_min_s``) is killed and started again, long before the configured
    ready timeout (60 s here); the next restart in a row gets twice the time (a busy machine
    is not cut off at the same point again and again); the event says where the hung start's
    log stopped."""
    sup = Supervisor(tmp_path / "logs", RestartPolicy(backoff_s=0.2, backoff_max_s=0.2,
                                                      hung_start_factor=2.0,
                                                      hung_start_min_s=1.0, stable_s=300),
                     reap_s=0.5)
    port, hang = free_port(), tmp_path / "hang"
    script = tmp_path / "child.py"
    script.write_text(HANGING)
    c = sup.start("engine-0", [sys.executable, str(script), str(port), str(hang)], role=ENGINE)
    try:
        sup.wait_ready(c, lambda: http_ok(f"http://127.0.0.1:{port}/health"), 60)
        limit = sup.policy.restart_timeout_s(c.first_ready_s, 60)
        assert c.first_ready_s is not None and limit < 5, (c.first_ready_s, limit)
        assert sup.policy.restart_timeout_s(c.first_ready_s, 60, 1) == 2 * limit
        hang.write_text("2")
        t0 = time.monotonic()
        os.kill(c.proc.pid, signal.SIGKILL)
        events = run_until(sup, lambda: c.state == RUNNING and c.restarts == 3, timeout_s=40)
        took = time.monotonic() - t0
        said = " (its log last said: waiting for the worker to come up)"
        assert f"engine-0 was not ready {limit:.0f} s after its restart{said}" in "\n".join(
            events), events
        assert any(f"engine-0 was not ready {2 * limit:.0f} s after its restart{said}" in e
                   for e in events), events
        assert took >= 3 * limit, (took, limit, events)
        assert any(e.startswith("engine-0 is back (restart 3") for e in events), events
        assert http_ok(f"http://127.0.0.1:{port}/health")
    finally:
        sup.stop_all(grace_s=2, straggler_s=1)


BURN = textwrap.dedent("""
    import subprocess, sys, time
    burner = subprocess.Popen([sys.executable, "-c",
        "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass\\n"
        "time.sleep(600)"])
    open(sys.argv[1], "w").write(str(burner.pid))
    time.sleep(600)
""")


def test_cpu_counts_a_childs_descendants_between_two_readings(tmp_path):
    """The demo's CPU accounting: what a child's process tree used between two readings,
    a grandchild's busy loop included, per process name; pure arithmetic for processes that
    start or end in between."""
    from anchorage.drive.report import cpu_summary
    from anchorage.stack.supervisor import cpu_used

    sup = Supervisor(tmp_path / "logs", reap_s=1.0)
    script, pid_file = tmp_path / "burn.py", tmp_path / "burner.pid"
    script.write_text(BURN)
    before = sup.cpu()          # nothing started yet
    c = sup.start("engine-0", [sys.executable, str(script), str(pid_file)], role=ENGINE)
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        burner = int(pid_file.read_text())
        time.sleep(1.5)         # the burner's 0.6 s of CPU (longer on a busy machine: waits)
        mid = sup.cpu()
        assert burner in {pid for pid, _ in mid["engine-0"]}
        used = cpu_used(before, mid)["engine-0"]
        assert sum(used.values()) >= 0.5, used
        # nothing burns after that: a later reading adds (almost) nothing
        time.sleep(0.3)
        again = cpu_used(mid, sup.cpu())["engine-0"]
        assert sum(again.values()) < 0.2, again
    finally:
        sup.stop_all(grace_s=2, straggler_s=1)
    assert not alive(c.proc.pid)
    # the arithmetic: a process that started in between counts whole, one that ended is
    # missing from the later reading; per process name, summed over processes
    b = {"engine-0": {(1, 10): ("python3", 2.0), (2, 11): ("VLLM::Worker", 5.0)}}
    a = {"engine-0": {(1, 10): ("python3", 2.5), (3, 12): ("VLLM::Worker", 1.0),
                      (4, 13): ("VLLM::Worker", 0.25)}, "router": {(5, 14): ("python3", 0.5)}}
    assert cpu_used(b, a) == {"engine-0": {"python3": 0.5, "VLLM::Worker": 1.25},
                              "router": {"python3": 0.5}}
    s = cpu_summary(cpu_used(b, a), {"ok": 4})
    assert s == {"cpu_s": 2.25, "cpu_ms_per_turn": 562.5, "cpu_router_s": 0.5}
