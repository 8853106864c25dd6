"""``round_robin``: cycle through healthy replicas in order (the baseline).

Inputs: replica health only. No parameters. The implementation lives in ``base`` (it
predates the registry); this module registers it.
"""

from anchorage.routing.base import RoundRobinRouter

ROUTERS = {"round_robin": lambda **params: RoundRobinRouter(**params)}
