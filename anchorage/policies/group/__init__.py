"""Group-scored eviction, the engine behind the ``cachescout``, ``cachewise`` and
``hybrid`` presets. One job per module, each opening with its specification:

- ``groups``: the mechanism (groups, free order, versioned lazy heap, victims);
- ``model``: the workload model (sessions, agents, gaps, transitions; bounded tables),
  read through ``view.ModelView`` (typed, read-only) by scorers and observers;
- ``scorers/``: one scorer per group kind, each with its typed parameters and formula;
- ``schedule``: when the groups are re-scored (full, or keys only);
- ``config``: signals, typed parameter sections, ``build_config`` (presets are a name and
  their signals);
- ``policy``: ``GroupEvictionPolicy``, wiring them to the pool's notifications.

Measured results behind the choices: ``docs/research/policies.md``.
"""

from anchorage.policies.group.config import (TUNING_DEFAULTS, GroupConfig, ModelParams,
                                             Signals, Tuning, build_config)
from anchorage.policies.group.groups import ANCHOR, ANON, DUP, OUTPUT, STALE, THREAD
from anchorage.policies.group.policy import GroupEvictionPolicy

__all__ = ["ANCHOR", "ANON", "DUP", "OUTPUT", "STALE", "THREAD", "TUNING_DEFAULTS",
           "GroupConfig", "GroupEvictionPolicy", "ModelParams", "Signals", "Tuning",
           "build_config"]
