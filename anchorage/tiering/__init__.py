"""Stall-aware KV tiering (TokenCake): a host-memory tier, the temporal offload policy and
the spatial reservation policy, plus their simulator adapter (``anchorage.tiering.sim``).
See ``docs/tiering.md``."""
