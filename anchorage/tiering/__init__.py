"""Stall-aware KV tiering (TokenCake): a host-memory tier, the temporal offload policy and
its controller (``controller``, called by the simulator and the engine alike), the spatial
reservation policy, and the simulator's adapter (``replica``, ``sim_spatial``, ``sim``).
See ``docs/tiering.md``."""
