"""One drive: plan a workload, scrape the engines' counters, replay it through the router
with a live progress line, scrape again, summarise. Shared by `anchorage drive` and
`anchorage demo`."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Callable

from anchorage.drive import metrics
from anchorage.drive.plan import PlanOptions, count, plan
from anchorage.drive.replay import Result, replay
from anchorage.drive.report import summarize
from anchorage.drive.workload import Workload


class Progress:
    """A one-line live status on stderr while it is a terminal; elsewhere (a log file, a
    pipe, CI) only the final line."""

    def __init__(self, total: int, label: str, stream=None, every_s: float = 0.5) -> None:
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if self.tty else float("inf")
        self.done = self.failed = self.prompt = self.cached = 0
        self.t0 = time.monotonic()
        self.last = 0.0

    def __call__(self, r: Result) -> None:
        self.done += 1
        self.failed += not r.ok
        self.prompt += r.prompt_tokens
        self.cached += r.cached_tokens
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done == self.total:
            self.last = now
            self.show(final=self.done == self.total)

    def show(self, final: bool = False) -> None:
        hit = self.cached / self.prompt if self.prompt else 0.0
        el = time.monotonic() - self.t0
        line = (f"  {self.label}: {self.done}/{self.total} requests, {self.failed} failed, "
                f"hit rate {hit:.3f}, {self.done / el if el else 0:.1f} req/s, {el:.0f} s")
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def drive(router_url: str, workload: Workload, opts: PlanOptions, engine_urls: list[str],
          concurrency: int, label: str = "drive", timeout_s: float = 300.0,
          say: Callable[[str], None] = print, node_agent_urls: list[str] | None = None,
          max_sessions: int = 0) -> tuple[dict[str, Any], list[Result]]:
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per request otherwise
    sessions = plan(workload.records, opts)
    n = count(sessions)
    say(f"  {label}: {n} requests in {len(sessions)} sessions, concurrency {concurrency}, "
        f"{max_sessions or 'unlimited'} sessions at once, time compression "
        f"{opts.time_compression:g}x")
    before = metrics.scrape(engine_urls) if engine_urls else None
    before_na = metrics.scrape_node_agents(node_agent_urls) if node_agent_urls else None
    prog = Progress(n, label)
    results, wall = asyncio.run(replay(router_url, sessions, concurrency, timeout_s, prog,
                                          max_sessions))
    time.sleep(0.5)  # let the engines' last counter updates land
    after = metrics.scrape(engine_urls) if engine_urls else None
    summary = summarize(results, wall, metrics.delta(before, after))
    if node_agent_urls:
        time.sleep(1.0)   # the sidecars mirror the plugin's snapshot every tick
        summary["node_agents"] = metrics.delta(before_na, metrics.scrape_node_agents(node_agent_urls))
    return summary, results
