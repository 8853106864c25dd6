"""``prefix`` and ``precise_prefix``: prefer the replica holding the longest cached prefix.

``prefix`` (the Gateway API inference extension's approximate ``prefix-cache-scorer``):
``score_r = m_r / len(keys)``, ``m_r`` the number of the request's leading block keys the
replica holds in a model of its cache built from the router's own decisions (each routed
request's keys inserted, an LRU per replica of ``capacity_blocks``, default 100,000, or with
``capacity_from_view`` True, the default, the replica's reported capacity: the extension's
``autoTune``; False keeps ``capacity_blocks``: its ``lruCapacityPerServer``, as llm-d's
tiered-prefix-cache guide sets for its CPU-prefix scorer).

``precise_prefix`` (llm-d's ``precise-prefix-cache-scorer`` over ``llm-d-kv-cache``): the
index is the replicas' KV events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``),
per medium (``TieredPrefixIndex``: the GPU's and the offloading connector's ``"CPU"`` tier),
so it sees evictions from either. Raw score (``llm-d-kv-cache``
``pkg/kvcache/kvblock_scorer.go`` ``LongestPrefixScorer.Score``: over the leading keys some
tier of the pod holds, the sum of the best weight among the tiers holding each key):
``raw_r = w_GPU * device_r + w_CPU * lower_r`` (``device_r`` the leading keys on the GPU,
``lower_r`` the prefix's continuation in host memory; a continuation key also on the GPU is
rare, the GPU's cache being prefix-closed, and is weighted as host here). ``medium_weights``
default ``{"GPU": 1.0, "CPU": 0.8}``: ``pkg/kvcache/backend.go``
``DefaultKVCacheBackendConfig``. ``normalization``:

- ``"absolute"`` (default: llm-d-inference-scheduler's main branch since #1107, 2026-05-14,
  ``preciseprefixcache/utils.go`` ``absoluteScoredPods``, "switch to absolute matched/total
  normalization"): ``min(1, raw_r / len(keys))``;
- ``"min-max"`` (v0.8.0, 2026-04-25, the last release before it,
  ``indexedScoresToNormalizedScoredPods``): over the pods with a raw score (those holding
  the first key in some tier, whether or not the filters kept them),
  ``(raw - min) / (max - min)``, every one of them 1.0 when ``max == min`` (a sole match
  included); a pod without a raw score 0.

0 for a request without keys. Unknown parameters or media raise ``ValueError``.
"""

from __future__ import annotations

from anchorage.routing.prefix_index import PrefixIndex, TieredPrefixIndex
from anchorage.routing.scorers.base import Scorer

MEDIUM_WEIGHTS = {"GPU": 1.0, "CPU": 0.8}   # llm-d-kv-cache DefaultKVCacheBackendConfig
NORMALIZATIONS = ("min-max", "absolute")


class PrefixScorer(Scorer):
    def __init__(self, capacity_blocks: int = 100_000, from_events: bool = False,
                 capacity_from_view: bool = True) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be > 0, got {capacity_blocks!r}")
        self.from_events = from_events
        self.capacity_from_view = capacity_from_view
        self.index = PrefixIndex(None if from_events else capacity_blocks)
        self._capacity = capacity_blocks

    def score(self, ctx, reps, pos):
        keys = ctx.keys
        if not keys:
            return [0.0] * len(pos)
        if not self.from_events:
            for p in pos:
                cap = (reps[p].capacity_blocks or self._capacity if self.capacity_from_view
                       else self._capacity)
                self.index.set_capacity(reps[p].index, cap)
        m = self.index.match(keys)
        return [m.get(reps[p].index, 0) / len(keys) for p in pos]

    def on_start(self, ctx, replica):
        if not self.from_events:
            self.index.insert(replica, ctx.keys)

    def on_kv_event(self, replica, event):
        if self.from_events:
            self.index.apply_event(replica, event)

    def on_replica_removed(self, replica):
        self.index.clear(replica)

    def predicted_hit_blocks(self, ctx, replica):
        return self.index.match_len(replica, ctx.keys)


class PrecisePrefixScorer(Scorer):
    """llm-d's precise prefix scorer over a tier-aware index (module specification)."""

    def __init__(self, medium_weights: dict | None = None,
                 normalization: str = "absolute") -> None:
        w = dict(MEDIUM_WEIGHTS if medium_weights is None else medium_weights)
        if "GPU" not in w or any(not isinstance(v, (int, float)) or v < 0 for v in w.values()):
            raise ValueError(f"medium_weights need a GPU weight and weights >= 0, got {w!r}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, "
                             f"got {normalization!r}")
        self.weights = w
        self.normalization = normalization
        self.index = TieredPrefixIndex([m for m in w if m != "GPU"])
        self._lower_w = max((v for m, v in w.items() if m != "GPU"), default=0.0)

    def raw_scores(self, keys) -> dict[int, float]:
        wg, wl = self.weights["GPU"], self._lower_w
        return {r: wg * d + wl * lo for r, (d, lo) in self.index.match_tiers(keys).items()}

    def score(self, ctx, reps, pos):
        keys = ctx.keys
        if not keys:
            return [0.0] * len(pos)
        raw = self.raw_scores(keys)
        if self.normalization == "absolute":
            n = len(keys)
            return [min(1.0, raw.get(reps[p].index, 0.0) / n) for p in pos]
        if not raw:
            return [0.0] * len(pos)
        lo, hi = min(raw.values()), max(raw.values())
        out = []
        for p in pos:
            s = raw.get(reps[p].index)
            out.append(0.0 if s is None else 1.0 if hi == lo else (s - lo) / (hi - lo))
        return out

    def on_kv_event(self, replica, event):
        self.index.apply_event(replica, event)

    def on_replica_removed(self, replica):
        self.index.clear(replica)

    def predicted_hit_blocks(self, ctx, replica):
        return self.index.match_len(replica, ctx.keys)


SCORERS = {"prefix": PrefixScorer,
           "precise_prefix": lambda **kw: PrecisePrefixScorer(**kw)}
