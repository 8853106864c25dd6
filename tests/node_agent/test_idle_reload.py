"""An idle engine core applies a changed ANCHORAGE_CONFIG (``node_agent.idle_reload``): the
ticker wakes vLLM's busy loop with its no-op WAKEUP request, the engine-core thread runs
the pools' reload check, every other request goes to vLLM's own handler. Fast: an engine
core stand-in with a real ``queue.Queue``, a real ``ConfigWatcher`` over a file and a
reloader stand-in. The real engine-core process is in ``test_sidecar_vllm.py`` (the
engine reaches a new generation while no request is sent)."""

from __future__ import annotations

import os
import queue
import threading
import time
from types import SimpleNamespace

import pytest

from anchorage.node_agent import idle_reload
from anchorage.node_agent import vllm_compat as vc
from anchorage.node_agent.config import ConfigWatcher


class Reloader:
    """What ``PolicyReloader.maybe_reload`` does with its watcher, minus the policy swap."""

    def __init__(self, watcher: ConfigWatcher) -> None:
        self.watcher, self.current, self.thread = watcher, None, None

    def maybe_reload(self) -> bool:
        self.thread = threading.current_thread()
        cfg = self.watcher.poll(time.monotonic())
        if cfg is None:
            return False
        self.current = cfg
        return True


class Core(SimpleNamespace):
    """An engine core stand-in (weak-referenceable, as vLLM's EngineCoreProc is)."""

    __slots__ = ("__weakref__",)


def core_with(path, check_s=0.0, running=True):
    pool = SimpleNamespace()
    r = Reloader(ConfigWatcher(str(path), "lru", check_s))
    r.watcher.load()
    vc.set_reloader(pool, r)
    core = Core(scheduler=SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=pool)),
                input_queue=queue.Queue(), state={"running": running})
    core.is_running = lambda: core.state["running"]
    return core, r


def write(path, text):   # a ConfigMap update: a new file swapped in
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture
def wakeup(monkeypatch):
    monkeypatch.setattr(vc, "engine_wakeup_type", lambda: "WAKEUP")
    monkeypatch.setattr(idle_reload, "MIN_INTERVAL_S", 0.05)
    seen = []
    monkeypatch.setitem(vc.ORIGINALS, "EngineCoreProc._handle_client_request",
                        lambda self, t, r: seen.append((t, r)))
    return seen


def test_ticks_reach_the_engine_thread_and_apply_a_new_document(tmp_path, wakeup):
    path = tmp_path / "anchorage.yaml"
    write(path, "generation: 1\npolicy: {name: lru}\n...\n")
    core, r = core_with(path)
    t = idle_reload.start(core)
    assert t is not None and t.daemon
    item = core.input_queue.get(timeout=5)
    assert item == ("WAKEUP", idle_reload.TICK)
    # the engine thread (here: this one) takes the tick off the queue: nothing changed yet
    idle_reload.handle_client_request(core, *item)
    assert r.current is None and r.thread is threading.current_thread()
    write(path, "generation: 2\npolicy: {name: hybrid}\n...\n")
    idle_reload.handle_client_request(core, *core.input_queue.get(timeout=5))
    assert r.current.generation == 2 and r.current.name == "hybrid"
    assert wakeup == []          # ticks never reach vLLM's handler
    core.state["running"] = False   # shutdown: the ticker stops
    t.join(5)
    assert not t.is_alive()


def test_other_requests_go_to_vllms_handler_and_nothing_starts_without_a_reloader(tmp_path,
                                                                                   wakeup):
    path = tmp_path / "anchorage.yaml"
    write(path, "generation: 1\npolicy: {name: lru}\n...\n")
    core, r = core_with(path)
    idle_reload.handle_client_request(core, "WAKEUP", None)       # vLLM's own wake-up
    idle_reload.handle_client_request(core, "ADD", ("req", 0))
    assert wakeup == [("WAKEUP", None), ("ADD", ("req", 0))] and r.thread is None
    bare = SimpleNamespace(scheduler=SimpleNamespace(
        kv_cache_manager=SimpleNamespace(block_pool=SimpleNamespace())), input_queue=queue.Queue())
    assert idle_reload.start(bare) is None
    assert idle_reload.reloaders(SimpleNamespace()) == []         # no scheduler yet


def test_the_interval_is_the_check_interval_with_a_floor(tmp_path, monkeypatch):
    monkeypatch.setattr(vc, "engine_wakeup_type", lambda: "WAKEUP")
    path = tmp_path / "anchorage.yaml"
    write(path, "generation: 1\npolicy: {name: lru}\n...\n")
    core, _ = core_with(path, check_s=0.0)   # ANCHORAGE_CONFIG_CHECK_S=0: not a busy loop
    started = []
    monkeypatch.setattr(idle_reload.threading, "Thread",
                        lambda **kw: started.append(kw) or SimpleNamespace(start=lambda: None))
    idle_reload.start(core)
    assert started[0]["args"][2] == idle_reload.MIN_INTERVAL_S == 1.0
    core2, _ = core_with(path, check_s=7.5)
    idle_reload.start(core2)
    assert started[1]["args"][2] == 7.5


def test_the_first_queue_poll_starts_the_ticker_once(tmp_path, monkeypatch, wakeup):
    path = tmp_path / "anchorage.yaml"
    write(path, "generation: 1\npolicy: {name: lru}\n...\n")
    core, _ = core_with(path)
    polls, starts = [], []
    monkeypatch.setitem(vc.ORIGINALS, "EngineCoreProc._process_input_queue",
                        lambda self: polls.append(self))
    monkeypatch.setattr(idle_reload, "start", lambda c: starts.append(c))
    idle_reload.process_input_queue(core)
    core._process_input_queue()          # the instance now calls vLLM's method directly
    core._process_input_queue()
    assert polls == [core, core, core] and starts == [core]
