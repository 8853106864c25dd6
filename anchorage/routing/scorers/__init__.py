"""Scorers of the ``composite`` router (llm-d style), one per file.

Spec: a scorer is built from keyword parameters (unknown names raise ``ValueError``) and
returns, for a request and the replicas left by the filters, one score in [0, 1] per
replica; the composite router sums ``weight * score`` and its picker chooses. Each module
here defines ``SCORERS = {name: factory}`` and states its formula; modules are discovered
on import, so a new scorer is one new file, and its name is at once a valid weight name in
the ``AgentCachePolicy`` (``spec.routing.weights``) and the CRD's enum.

- ``queue``, ``waiting_queue``, ``kv_usage``: load (``queue.py``, ``kv_usage.py``);
- ``prefix``, ``precise_prefix``: cached prefix length (``prefix.py``);
- ``session``: session affinity (``session.py``); ``anchor``: agent anchors (``anchor.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from anchorage.routing.scorers.base import Positions, Scorer

__all__ = ["Positions", "Scorer", "SCORERS", "make_scorer", "scorer_names"]

SCORERS: dict[str, Callable[..., Scorer]] = {}
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name != "base" and not _info.name.startswith("_"):
        SCORERS.update(importlib.import_module(f"{__name__}.{_info.name}").SCORERS)


def scorer_names() -> list[str]:
    return list(SCORERS)


def make_scorer(name: str, **params: Any) -> Scorer:
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(SCORERS)}")
    try:
        return SCORERS[name](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for scorer {name!r}: {exc}") from None
