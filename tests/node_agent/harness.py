"""One node agent as a pod runs it, minus the GPU: the real sidecar (``anchorage
node-agent``'s ``Sidecar``) in a background thread, next to a fake engine (HTTP + KV events
on loopback/ipc) and a plugin snapshot written by the real exporter. The snapshot predicts
``agents`` next agents (probability 0.9, predictability R = 0.9) whose anchors are known,
so the sidecar warms whatever its configuration lets it. The snapshot's
``config_generation`` is what the plugin's own parser (``node_agent.config``) makes of the
same ``ANCHORAGE_CONFIG`` file (the last document it accepted), as in the engine.

Used by tests that drive the configuration from an AgentCachePolicy (tests/node_agent,
tests/chart/test_install.py)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from pathlib import Path

from anchorage.warmup import WarmupConfig

BS = 4


def write_atomically(path: Path, text: str) -> None:
    """As the kubelet updates a mounted ConfigMap: a new file swapped in at once."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.replace(path)


class NodeAgent:
    """``source``: what the plugin exports (default: 40 predicted agents at R = 0.9, a
    plain view); a real policy object may be given instead (``state.policy_view`` reads
    it), with the plugin's ``node_state`` and counters (``stats``)."""

    def __init__(self, workdir: Path, config_path: Path | None, *, agents: int = 40,
                 warmup: WarmupConfig | None = None, model: str = "tiny", source=None,
                 node_state=None, stats=None):
        from anchorage.node_agent.sidecar import Sidecar, SidecarConfig
        from anchorage.node_agent.exporter import PolicyStateExporter
        from tests.node_agent.fake_engine import FakeEngine

        self.workdir, self.config_path = workdir, config_path
        self.engine = FakeEngine(f"ipc://{workdir}/kv.ipc", model=model)
        self.agents = [f"fp:{i:02d}" for i in range(agents)]
        self.view = {"policy": "hybrid", "predictability": 0.9, "block_size": BS,
                     "predictions": [{"agent": a, "probability": 0.9} for a in self.agents],
                     "anchors": [{"agent": a, "hint": a.upper(), "first_s": 0.0,
                                  "last_seen_s": 0.0, "requests": 1,
                                  "token_ids": [1000 + 8 * i + j for j in range(2 * BS)]}
                                 for i, a in enumerate(self.agents)]}
        self.plugin_generation = 0
        self.exporter = PolicyStateExporter(source if source is not None else (lambda: self.view),
                                            workdir / "state.json", interval_s=0.05,
                                            policy_name="hybrid", node_state=node_state,
                                            stats=stats,
                                            config_generation=self._plugin_generation)
        # the node agent's own settings would warm up to 100/s, 10 per tick, gate 0.3
        self.sidecar = Sidecar(SidecarConfig(
            engine_url=self.engine.url, kv_events=f"ipc://{workdir}/kv.ipc",
            state_dir=str(workdir), port=0, tick_s=0.05, snapshot_max_age_s=2.0,
            policy_env="hybrid", config_path=str(config_path) if config_path else None,
            warmup=warmup or WarmupConfig(rate_per_s=100, burst=1, cooldown_s=3600,
                                          max_per_tick=10)))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def _plugin_generation(self) -> int:
        from anchorage.node_agent.config import ConfigError, read_policy_config

        if self.config_path is None:
            return 0
        try:
            self.plugin_generation = read_policy_config(str(self.config_path)).generation
        except ConfigError:
            pass   # the plugin keeps the last document it accepted
        return self.plugin_generation

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> "NodeAgent":
        """Run the sidecar (its loop and HTTP server) in a thread; returns self."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the sidecar did not start: {self.error!r}")
        return self

    def _run(self) -> None:
        async def main():
            self._loop = asyncio.get_running_loop()
            await self.sidecar.start()
            self.exporter.start()
            self._ready.set()
            try:
                await self.sidecar.run_loop()
            finally:
                await self.sidecar.stop()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by start() / stop()
            self.error = exc
            self._ready.set()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.sidecar.request_stop)
        if self._thread is not None:
            self._thread.join(20)
        self.exporter.stop()
        self.engine.close()
        if self.error is not None:
            raise self.error

    # -- what a test observes ---------------------------------------------------------------
    @property
    def warmups_sent(self) -> int:
        return len(self.engine.completions)

    def quiescent_counts(self, timeout_s: float = 10.0, still_s: float = 0.3) -> tuple[int, float]:
        """``(warm-ups the engine received, the sidecar's issued counter)`` read at one
        quiescent point: once every warm-up the sidecar issued has reached the engine
        (the counter moves before the POST is sent, the engine's list when it lands) and
        neither has moved for ``still_s``. Two reads at different moments while warm-ups
        flow disagree by the ones in between (a flaky ``6.0 == 5``); call this only once
        the test has stopped them (gate closed, prefetch off)."""
        deadline = time.monotonic() + timeout_s
        last = None
        since = time.monotonic()
        while True:
            now = (self.warmups_sent, self.metric("anchorage_warmups_total", outcome="issued"))
            if now != last:
                last, since = now, time.monotonic()
            elif now[0] == (now[1] or 0) and time.monotonic() - since >= still_s:
                return now
            if time.monotonic() > deadline:
                raise AssertionError(f"warm-ups never settled (sent, issued): {now}")
            time.sleep(0.05)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.sidecar.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, **labels) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith((name + "{", name + " ")) and all(
                    f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None


def wait(pred, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
