"""Token ids checked inside the engine, with or without vLLM's tokenizer.

vLLM checks a token-id prompt against the vocabulary in its renderer
(``vllm/renderers/base.py``, ``BaseRenderer.validate_token_ids``: an id below 0 or above
``max(tokenizer.max_token_id, model vocab size - 1)`` is a ``VLLMValidationError``, a 400)
but skips the check when the tokenizer is not initialised (``--skip-tokenizer-init``, as
the local stack and the chart's tiny models run it). An id at or above the vocabulary then
reaches the model's embedding and kills the engine core; anything on the pod network can
reach an engine port, so the router's own check (``router.limits``) is not enough.

``install()`` wraps that method: without a tokenizer, ids are checked against the model's
vocabulary (``model_config.get_vocab_size()``), with vLLM's own error and message; with
one, vLLM's check runs unchanged. Installed by the plugin's entry point in every process
that loads it (the API server is where prompts are rendered), whatever
``ANCHORAGE_POLICY`` says; ``ANCHORAGE_TOKEN_ID_CHECK=off`` leaves vLLM's method as it is.
Idempotent; on a vLLM without that method, one warning and nothing patched.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("anchorage.node_agent")
ENV = "ANCHORAGE_TOKEN_ID_CHECK"
_MARK = "_anchorage_token_id_check"


def enabled(environ=os.environ) -> bool:
    return environ.get(ENV, "").strip().lower() not in ("off", "0", "false", "no")


def check(token_ids, vocab_size: int, parameter: str | None = None) -> None:
    """Raise vLLM's ``VLLMValidationError`` for an id outside ``[0, vocab_size)``."""
    from vllm.exceptions import VLLMValidationError

    lo, hi = min(token_ids), max(token_ids)
    if lo < 0:
        raise VLLMValidationError(f"Token id {lo} is out of vocabulary", parameter=parameter)
    if hi >= vocab_size:
        raise VLLMValidationError(f"Token id {hi} is out of vocabulary (the model's "
                                  f"vocabulary has {vocab_size} tokens)", parameter=parameter)


def install() -> bool:
    """Wrap ``BaseRenderer.validate_token_ids``; True when the check is in force."""
    if not enabled():
        return False
    try:
        from vllm.renderers.base import BaseRenderer
    except ImportError as exc:
        log.warning("anchorage: token ids are not checked without a tokenizer (%s)", exc)
        return False
    original = getattr(BaseRenderer, "validate_token_ids", None)
    if original is None:
        log.warning("anchorage: this vLLM has no BaseRenderer.validate_token_ids; token ids "
                    "are not checked without a tokenizer")
        return False
    if getattr(original, _MARK, False):
        return True

    def validate_token_ids(self, token_ids, *, parameter=None):
        if token_ids and getattr(self, "tokenizer", None) is None:
            check(token_ids, int(self.model_config.get_vocab_size()), parameter)
            return None
        return original(self, token_ids, parameter=parameter)

    setattr(validate_token_ids, _MARK, True)
    validate_token_ids.__wrapped__ = original
    BaseRenderer.validate_token_ids = validate_token_ids
    return True


FAILURE_ENV = "ANCHORAGE_ENGINE_FAILURE_FILE"


def record_engine_failure(environ=os.environ) -> bool:
    """With ``ANCHORAGE_ENGINE_FAILURE_FILE`` set: an engine core that dies of an error
    (vLLM's ``EngineCoreProc._send_engine_dead``, sent from its fatal-error handler)
    appends a line to that file first. The front end then stops the dying core itself
    (``terminate``), which made a crash look like an orderly shutdown with status 0; the
    local stack's wrapper (``anchorage.stack.vllm_server``) reads the file. Idempotent."""
    path = environ.get(FAILURE_ENV, "").strip()
    if not path:
        return False
    try:
        from vllm.v1.engine.core import EngineCoreProc
    except ImportError:
        return False
    original = getattr(EngineCoreProc, "_send_engine_dead", None)
    if original is None or getattr(original, _MARK, False):
        return original is not None

    def _send_engine_dead(self, *args, **kwargs):
        import sys
        exc = sys.exc_info()[1]
        try:
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {type(exc).__name__ if exc else 'error'}: "
                        f"{str(exc).splitlines()[0][:300] if exc and str(exc) else ''}\n")
        except OSError:
            pass
        return original(self, *args, **kwargs)

    setattr(_send_engine_dead, _MARK, True)
    EngineCoreProc._send_engine_dead = _send_engine_dead
    return True
