"""The seed papers' algorithms as published, beside Anchorage's reformulations, each
behind the SGLang gateway's prefix-aware router (the papers evaluate one engine; their
deployment section puts a prefix-matching load balancer in front).

- ``cachewise-paper``: CacheWise (Tiwari et al.) sections 5.1-5.3: prefix-aware
  scheduling and ``E[tau | tau > elapsed]`` eviction with TF-IDF argument clusters,
  periodic re-scoring (``anchorage.policies.cachewise_paper``);
  ``cachewise-anchorage``: Anchorage's ``cachewise`` (expected wait per reuse).
- ``cachescout-paper``: CacheScout eq. 7-9 (thresholded transition graph, BFS hop
  distance, recency decay; ``anchorage.policies.cachescout_paper``);
  ``cachescout-anchorage``: Anchorage's ``cachescout``.
- ``tokencake-paper``: TokenCake's temporal gate as published (window = predicted stall
  minus the round trip, hard rejections host capacity / stall too short / no waiting
  request fits / low pressure, soft score; a stalled agent that is not offloaded keeps
  its GPU memory; the stall excludes the admission wait) and its spatial reservation;
  ``tokencake-anchorage``: Anchorage's ``tokencake`` tiering (the reformulated gate:
  benefit per byte, holds only for short stalls, backups, the admission wait in the
  stall).
"""

from anchorage.fleet.spec import StackSpec
from anchorage.fleet.stacks.smg import SMG_ROUTER

COMMON = dict(router="prefix", router_params=dict(SMG_ROUTER), role="paper")

STACKS = {
    "cachewise-paper": StackSpec(
        name="cachewise-paper", peer="CacheWise as published",
        source="CacheWise sections 5.1-5.3 (cachewise.md)", policy="cachewise-paper",
        admission="prefix-aware", **COMMON),
    "cachewise-anchorage": StackSpec(
        name="cachewise-anchorage", peer="Anchorage's cachewise",
        source="anchorage/policies/cachewise.py", policy="cachewise",
        admission="prefix-aware", **COMMON),
    "cachescout-paper": StackSpec(
        name="cachescout-paper", peer="CacheScout as published (eq. 7-9)",
        source="CacheScout sections 3.2-3.3, Algorithm 1 (cachescout.md)",
        policy="cachescout-paper", **COMMON),
    "cachescout-anchorage": StackSpec(
        name="cachescout-anchorage", peer="Anchorage's cachescout",
        source="anchorage/policies/cachescout.py", policy="cachescout", **COMMON),
    "tokencake-paper": StackSpec(
        name="tokencake-paper", peer="TokenCake as published",
        source="TokenCake sections 4-5 (tokencake.md): gate, hold on rejection, spatial",
        policy="lru", tiering="tokencake",
        gate={"count_reload": True, "min_saving_ratio": 0.0, "hold_rejected": True},
        tiering_params={"queue_wait": False}, **COMMON),
    "tokencake-anchorage": StackSpec(
        name="tokencake-anchorage", peer="Anchorage's tokencake tiering",
        source="anchorage/tiering (temporal, spatial, controller)", policy="lru",
        tiering="tokencake", **COMMON),
}
