"""Routing policies: pure replica choice shared by the simulator and the Ray Serve router.

``make_router(name, **params)`` builds one; ``router_names()`` lists them."""

from anchorage.routing.base import NoReplicaError, ReplicaView, Router  # noqa: F401
from anchorage.routing.registry import make_router, router_names  # noqa: F401
