"""Anchorage core: block keys, agent fingerprints, eviction policies, traces, simulator.

The core imports no vLLM, Ray, kopf or kubernetes: adapters in ``anchorage.node_agent``,
``anchorage.router`` and ``anchorage.operator`` translate the outside world into it.
"""

__version__ = "0.1.0"
