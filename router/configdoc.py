"""The operator's document (``anchorage.yaml``, issue 16 item 2): the router applies its
``routing: {policy, weights | parameters}`` on change, without a restart and without
dropping requests.

``read_routing(text)`` is the one place the router reads the document (the core's typed
``anchorage.config.document``, as the operator, plugin and sidecar do).
``weights`` are scorer names and weights of the ``composite`` policy
(``{"prefix": 2, "queue": 1}``); ``parameters`` are a policy's own parameters. A
document that is empty, truncated, unparsable or names an unknown policy/parameter is
refused: the policy in force stays, ``anchorage_router_config_rejected_total`` counts it
and the log says why. ``ConfigWatch`` polls one file (every model) or a directory of
``<model>/anchorage.yaml`` (one policy per model, as the chart mounts them, at the model's
*served* name, the ``model`` field requests carry; a served name with ``/``, such as
``meta-llama/Llama-3.1-8B``, is a nested directory; the kubelet's ``..data`` and
timestamped entries of a ConfigMap volume are skipped); a change is
applied between two requests (the event loop runs one at a time): requests in flight
finish on the replica they were sent to.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from anchorage.config import document
from anchorage.config.document import ConfigError

log = logging.getLogger("anchorage.router")
DATA_KEY = "anchorage.yaml"


def read_routing(text: str) -> tuple[int, str, dict[str, Any]]:
    """(generation, policy name, ``make_router`` keyword arguments) of a document, parsed by
    the core's typed document (``anchorage.config.document``); ConfigError if bad."""
    doc = document.parse(text)          # ConfigError: empty, truncated, a bad field
    routing = doc.routing
    problems = routing.problems()       # the router refuses the parameters
    if problems:
        raise ConfigError(problems[0])
    return doc.generation, routing.policy, routing.router_kwargs()


class ConfigWatch:
    def __init__(self, state, file: str = "", directory: str = "") -> None:
        self.state, self.file, self.directory = state, file, directory
        self._seen: dict[str, tuple] = {}
        self.generation: dict[str, int] = {}
        self.errors: dict[str, str] = {}

    def _docs(self) -> list[tuple[str | None, Path]]:
        out: list[tuple[str | None, Path]] = []
        if self.file:
            out.append((None, Path(self.file)))
        if self.directory and os.path.isdir(self.directory):
            for here, dirs, files in os.walk(self.directory, followlinks=True):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".."))
                model = os.path.relpath(here, self.directory).replace(os.sep, "/")
                if DATA_KEY in files and model != ".":
                    out.append((model, Path(here) / DATA_KEY))
        return out

    def poll(self) -> None:
        for model, path in self._docs():
            try:
                st = path.stat()
                stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:
                continue
            key = str(path)
            if self._seen.get(key) == stamp:
                continue
            self._seen[key] = stamp
            self.apply(model, path.read_text(errors="replace"))

    def apply(self, model: str | None, text: str) -> bool:
        label = model or "*"
        try:
            gen, name, params = read_routing(text)
            self.state.set_policy(model, name, params)
        except ValueError as exc:      # ConfigError, unknown policy, bad parameters
            self.errors[label] = str(exc)
            self.state.metrics.config_rejected.labels(label).inc()
            log.error("routing config for %s refused, keeping the policy in force: %s",
                      label, exc)
            return False
        self.errors.pop(label, None)
        self.generation[label] = gen
        self.state.metrics.config_generation.labels(label).set(gen)
        return True

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - keep serving on the policy in force
                log.exception("reading the routing config failed")
            await asyncio.sleep(interval_s)

    def status(self) -> dict[str, Any]:
        return {"generation": dict(self.generation), "errors": dict(self.errors)}
