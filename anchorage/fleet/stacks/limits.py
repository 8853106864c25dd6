"""Limits: what the same compute does with more memory.

- ``limit-hbm``: one HBM pool as large as the whole workload shared by all the replicas'
  schedulers (the cluster's ``pooled`` mode: nothing is ever evicted and every prefix is
  on every replica), each request to the least loaded scheduler, same engines and
  compute, prefix-aware admission. The reference every table's "vs limit" column divides
  by.
- ``limit-host``: Anchorage's full stack with host DRAM without bound.
- ``limit-tiers``: Anchorage's full stack with host DRAM without bound behind a link
  without cost: whatever HBM evicts comes back at once, for free, so no eviction order,
  host-tier policy or prefetch reaches more with this HBM (Belady across device, host and
  dropped included). What stays: the HBM each running request needs, and whom admission
  and scheduling run first.
"""

from dataclasses import replace

from anchorage.fleet.spec import StackSpec
from anchorage.fleet.stacks.anchorage_stack import FULL

STACKS = {
    "limit-hbm": StackSpec(
        name="limit-hbm", peer="infinite HBM, same compute",
        source="anchorage.fleet (capacity = the workload's blocks)", role="limit",
        router="pooled", policy="lru", admission="prefix-aware", limit="infinite-device"),
    "limit-host": replace(FULL, name="limit-host", role="limit",
                          peer="Anchorage with infinite host DRAM", limit="infinite-host"),
    "limit-tiers": replace(FULL, name="limit-tiers", role="limit",
                           peer="Anchorage with free reloads (host DRAM and link without bound)",
                           limit="free-tiers"),
}
