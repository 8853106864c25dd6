"""The ``vllm.general_plugins`` entry point: Anchorage eviction policies inside vLLM.

``ANCHORAGE_POLICY`` names the policy (any online policy of
``anchorage.policies.registry``: ``lru``, ``hybrid``, ``cachescout``, ``cachewise``...).
Unset, empty or ``off`` leaves vLLM exactly stock: nothing is patched. On an unsupported
vLLM version, an unexpected internal shape, an unknown or offline-only policy, the plugin
logs one warning and vLLM stays stock.

vLLM calls ``register()`` in every process that loads general plugins (engine core,
workers, front end) and possibly several times; it is idempotent, and only the engine
core builds a ``BlockPool``, which is where the policy attaches.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("anchorage.node_agent")

ENV_POLICY = "ANCHORAGE_POLICY"
OFF = ("", "off", "none", "stock")


def configured_policy() -> str | None:
    name = os.environ.get(ENV_POLICY, "").strip().lower()
    return None if name in OFF else name


def register() -> bool:
    """Entry point. Returns True when the engine's block pool will be policy-driven."""
    name = configured_policy()
    if name is None:
        return False
    from anchorage.policies.registry import is_offline, policy_names

    if name not in policy_names(include_offline=True):
        log.warning("anchorage: %s=%r is not a known policy (known: %s); vLLM stays stock",
                    ENV_POLICY, name, ", ".join(policy_names(include_offline=False)))
        return False
    if is_offline(name):
        log.warning("anchorage: %s=%r reads the future and exists only in the simulator; "
                    "vLLM stays stock", ENV_POLICY, name)
        return False
    from anchorage.node_agent import vllm_block_pool

    reason = vllm_block_pool.unsupported_reason()
    if reason is not None:
        log.warning("anchorage: %s; vLLM stays stock", reason)
        return False
    vllm_block_pool.install(name)
    log.info("anchorage: eviction policy %r drives vLLM's block pool", name)
    return True
