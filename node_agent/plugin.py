"""The ``vllm.general_plugins`` entry point: Anchorage eviction policies inside vLLM.

``ANCHORAGE_POLICY`` switches the plugin on and names the default policy (any online
policy of ``anchorage.policies.registry``: ``lru``, ``hybrid``, ``cachescout``,
``cachewise``...). Unset, empty or ``off`` leaves vLLM exactly stock: nothing is patched
and ``ANCHORAGE_CONFIG`` is not read. On an unsupported vLLM version, an unexpected
internal shape, an unknown or offline-only policy, the plugin logs one warning and vLLM
stays stock.

``ANCHORAGE_CONFIG`` (the operator's ConfigMap mount, ``anchorage.yaml``) gives the
policy's parameters, and its name when the file names one (precedence and format:
``anchorage.node_agent.config``); it is read here at start and re-read by each
policy-driven block pool when it changes (``anchorage.node_agent.reload``). A file that
cannot be applied at start (bad YAML, unknown policy, parameters the policy rejects):
one warning, ``ANCHORAGE_POLICY`` with its defaults, generation 0.

``ANCHORAGE_SCHEDULER=prefix-aware`` (independent of the policy) makes the engine core use
the prefix-aware admission scheduler (``anchorage.node_agent.scheduler``).

Independent of the policy too, token-id prompts are checked against the model's
vocabulary even when vLLM skips its tokenizer (``anchorage.node_agent.token_ids``: vLLM's
own check, which it skips then; an out-of-vocabulary id would kill the engine core), unless
``ANCHORAGE_TOKEN_ID_CHECK=off``; and with ``ANCHORAGE_ENGINE_FAILURE_FILE`` set (the local
stack's ``vllm_server`` sets it), an engine core that dies of an error writes it there
before vLLM's front end stops it (``token_ids.record_engine_failure``).

vLLM calls ``register()`` in every process that loads general plugins (engine core,
workers, front end) and possibly several times; it is idempotent, and only the engine
core builds a ``BlockPool`` and a scheduler, which is where Anchorage attaches.
"""

from __future__ import annotations

import logging
import os

from anchorage.node_agent.config import (  # noqa: F401
    ENV_CONFIG,
    ENV_POLICY,
    OFF,
    ConfigWatcher,
    PolicyConfig,
    check_interval_s,
    env_policy,
)

log = logging.getLogger("anchorage.node_agent")


def configured_policy() -> str | None:
    return env_policy()


def startup_config(name: str) -> tuple[PolicyConfig, ConfigWatcher | None]:
    """The policy config in force at start (``name``: ``ANCHORAGE_POLICY``) and the file's
    watcher (None without ``ANCHORAGE_CONFIG``). Never raises."""
    path = os.environ.get(ENV_CONFIG, "").strip()
    cfg = PolicyConfig(name)
    if not path:
        return cfg, None
    watcher = ConfigWatcher(path, name, check_interval_s())
    loaded = watcher.load()
    if loaded is not None:
        from anchorage.policies.registry import make_policy

        try:  # the parameters are checked by building the policy once
            make_policy(loaded.name, params=loaded.params)
        except (TypeError, ValueError) as exc:
            watcher.warn_rejected(f"policy {loaded.name!r} rejects its parameters "
                                  f"{sorted(loaded.params)}: {exc}")
        else:
            cfg = loaded
    return cfg, watcher


def register() -> bool:
    """Entry point. Returns True when the engine's block pool will be policy-driven."""
    from anchorage.node_agent import scheduler, token_ids

    token_ids.install()
    token_ids.record_engine_failure()
    scheduler.register()
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
    from anchorage.node_agent import vllm_hooks

    reason = vllm_hooks.unsupported_reason()
    if reason is not None:
        log.warning("anchorage: %s; vLLM stays stock", reason)
        return False
    cfg, watcher = startup_config(name)
    vllm_hooks.install(cfg.name, cfg.params, generation=cfg.generation, startup=cfg,
                       watcher=watcher)
    log.info("anchorage: eviction policy %r drives vLLM's block pool (%s, generation %d)",
             cfg.name, "parameters " + str(cfg.params) if cfg.params else "default parameters",
             cfg.generation)
    return True
