"""``dynamo_kv``: NVIDIA Dynamo's KV router (``--router-mode kv``), its default worker
selector.

Spec (ai-dynamo/dynamo ``lib/kv-router/src/scheduling/selector/default.rs``
``DefaultWorkerScorer::worker_logit``, defaults in ``lib/kv-router/src/scheduling/config.rs``;
``sequence.rs`` ``potential_blocks_and_tokens``; documented in
``docs/router/kv_cache_routing.md``, "Cost Calculation"), per request with ``isl`` prompt
tokens and keys ``K`` (``b`` tokens per block), for each healthy worker ``w``:

- ``device_w``, ``host_w``: leading blocks of ``K`` cached on ``w``'s GPU, and the prefix's
  continuation in its host tier, from the workers' KV events per medium
  (``BlockStored`` / ``BlockRemoved``, ``medium`` GPU or CPU; ``TieredPrefixIndex``):
  Dynamo's tier-aware indexer over vLLM's offloading connector's self-describing events,
  or, with KVBM, a merged device-tier view (KVBM's event consolidator removes a block only
  when no tier holds it: ``host_cache_hit_weight`` 1.0 is that view;
  ``docs/components/router/router-offloading.md``);
- ``overlap_credit_w = overlap_score_credit * device_w + host_cache_hit_weight * host_w``
  (``--router-kv-overlap-score-credit`` 1.0, ``--router-host-cache-hit-weight`` 0.75:
  ``config.rs`` ``default_host_cache_hit_weight``; disk and shared tiers: none here);
- ``raw_prefill_blocks_w = (active_prefill_w + isl) / b``: the router's own count of prefill
  tokens it sent to ``w`` whose first token has not come back (each request adds
  ``isl - cached``, ``cached = (device + host_cache_hit_weight * host) * b``, its
  ``prefill_token_load``; ``mark_prefill_completed`` removes it), plus this request's;
- ``decode_blocks_w = active_blocks_w + new_blocks_w``: the distinct blocks of the requests
  in flight on ``w`` (the router's slot manager, by block hash) plus the request's blocks
  not among them;
- ``logit_w = prefill_load_scale * max(0, raw_prefill_blocks_w - overlap_credit_w) +
  decode_blocks_w`` (``--router-prefill-load-scale`` 1.0; the deprecated
  ``overlap_score_weight`` sets it, as Dynamo's ``apply_deprecated_overlap_score_weight_override``
  does). With GPU-only events and the defaults this is the older
  ``weight * (active + max(isl - overlap * b, 0)) / b + decode`` cost;
- selection: ``temperature = 0``: the minimum logit (ties within 1e-5: the smaller radix
  tree, i.e. fewer indexed device blocks, then the lower index); ``temperature > 0``:
  softmax sampling over ``-logit_w / (max - min) / temperature`` (uniform when all are equal).

On routing (``on_start``) the request joins ``w``'s active set; ``on_first_token`` marks
its prefill complete; ``on_finish`` frees it. Parameters (Dynamo's defaults):
``overlap_score_credit`` 1.0 (in [0, 1]), ``prefill_load_scale`` 1.0,
``host_cache_hit_weight`` 0.75 (in [0, 1]), ``overlap_score_weight`` (deprecated: sets
``prefill_load_scale``, and 0 also zeroes the credit), ``temperature`` 0.0
(``--router-temperature``), ``block_size`` (``--kv-cache-block-size``; 0: inferred per
request as ``ceil(isl / len(K))``), ``seed`` 0 (the sampling RNG).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Sequence

from anchorage.policies.base import RequestContext
from anchorage.routing.base import ReplicaView, Router, healthy_positions
from anchorage.routing.prefix_index import TieredPrefixIndex, held_prefix_len

TIE_EPSILON = 1e-5


def dynamo_logit(isl: int, overlap_blocks: int, block_size: int, active_prefill_tokens: int,
                 active_blocks: int, new_blocks: int, overlap_score_weight: float = 1.0, *,
                 host_blocks: int = 0, host_cache_hit_weight: float = 0.75,
                 overlap_score_credit: float = 1.0) -> float:
    """The selector's cost of one worker (lower is better); ``overlap_score_weight`` is the
    prefill load scale (``selector/default.rs`` ``worker_logit``)."""
    raw = (active_prefill_tokens + isl) / block_size
    credit = overlap_score_credit * overlap_blocks + host_cache_hit_weight * host_blocks
    return overlap_score_weight * max(0.0, raw - credit) + active_blocks + new_blocks


def softmax_probabilities(logits: Sequence[float], temperature: float) -> list[float]:
    """Dynamo's ``softmax_sample`` weights: ``-logit / (max - min)`` over ``temperature``."""
    lo, hi = min(logits), max(logits)
    if hi == lo:
        return [1.0 / len(logits)] * len(logits)
    scaled = [-(v / (hi - lo)) / temperature for v in logits]
    top = max(scaled)
    exps = [math.exp(v - top) for v in scaled]
    s = sum(exps)
    return [e / s for e in exps]


class _Active:
    """The router's view of one worker's requests in flight (Dynamo's slot manager)."""

    __slots__ = ("blocks", "prefill", "requests")

    def __init__(self) -> None:
        self.blocks: Counter = Counter()       # block key -> requests in flight using it
        self.prefill: dict[Any, int] = {}      # request -> prefill tokens not yet done
        self.requests: dict[Any, tuple] = {}   # request -> its keys

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefill.values())

    def new_blocks(self, keys: Sequence) -> int:
        """Keys not among the blocks in flight. Keys are chained (a key stands for its
        prefix) and each request adds a whole chain prefix, so the keys in flight are a
        prefix of ``keys``: a binary search finds its end."""
        return len(keys) - held_prefix_len(keys, self.blocks)


class DynamoKVRouter(Router):
    name = "dynamo_kv"

    def __init__(self, overlap_score_weight: float | None = None, temperature: float = 0.0,
                 block_size: int = 0, seed: int = 0, *, prefill_load_scale: float = 1.0,
                 overlap_score_credit: float = 1.0,
                 host_cache_hit_weight: float = 0.75) -> None:
        if overlap_score_weight is not None:  # Dynamo's deprecated override
            if overlap_score_weight < 0:
                raise ValueError("overlap_score_weight must be >= 0")
            prefill_load_scale = float(overlap_score_weight)
            if overlap_score_weight == 0:
                overlap_score_credit = 0.0
        if prefill_load_scale < 0 or temperature < 0 or block_size < 0:
            raise ValueError("prefill_load_scale, temperature and block_size must be >= 0")
        for name, v in (("overlap_score_credit", overlap_score_credit),
                        ("host_cache_hit_weight", host_cache_hit_weight)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be between 0.0 and 1.0, got {v!r}")
        self.overlap_score_weight = float(prefill_load_scale)   # the prefill load scale
        self.overlap_score_credit = float(overlap_score_credit)
        self.host_cache_hit_weight = float(host_cache_hit_weight)
        self.temperature = float(temperature)
        self.block_size = int(block_size)
        self.index = TieredPrefixIndex(("CPU",))
        self.active: dict[int, _Active] = {}
        self.rng = random.Random(seed)
        self._overlap: dict[Any, int] = {}

    def _bs(self, ctx: RequestContext) -> int:
        if self.block_size:
            return self.block_size
        n = len(ctx.keys)
        return max(1, -(-ctx.input_length // n)) if n else 1

    def _act(self, replica: int) -> _Active:
        a = self.active.get(replica)
        if a is None:
            a = self.active[replica] = _Active()
        return a

    def logits(self, ctx: RequestContext, replicas: Sequence[ReplicaView],
               pos: Sequence[int]) -> list[float]:
        bs = self._bs(ctx)
        matches = self.index.match_tiers(ctx.keys) if ctx.keys else {}
        out = []
        for p in pos:
            w = replicas[p].index
            a = self._act(w)
            dev, host = matches.get(w, (0, 0))
            out.append(dynamo_logit(ctx.input_length, dev, bs, a.prefill_tokens,
                                    len(a.blocks), a.new_blocks(ctx.keys),
                                    self.overlap_score_weight, host_blocks=host,
                                    host_cache_hit_weight=self.host_cache_hit_weight,
                                    overlap_score_credit=self.overlap_score_credit))
        return out

    def pick(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> int:
        pos = healthy_positions(replicas)
        logits = self.logits(ctx, replicas, pos)
        if self.temperature == 0.0:
            lo = min(logits)
            ties = [p for p, v in zip(pos, logits) if abs(v - lo) < TIE_EPSILON]
            return min(ties, key=lambda p: (self.index.size(replicas[p].index), p))
        probs = softmax_probabilities(logits, self.temperature)
        x, acc = self.rng.random(), 0.0
        for p, pr in zip(pos, probs):
            acc += pr
            if x <= acc:
                return p
        return pos[-1]

    def on_start(self, ctx: RequestContext, replica: int) -> None:
        a = self._act(replica)
        rid = ctx.request_id
        keys = tuple(ctx.keys)
        dev, host = self.index.tier_runs(replica, keys) if keys else (0, 0)
        cached = round((dev + self.host_cache_hit_weight * host) * self._bs(ctx))
        a.prefill[rid] = max(ctx.input_length - cached, 0)   # Dynamo's prefill_token_load
        a.requests[rid] = keys
        a.blocks.update(keys)

    def on_first_token(self, ctx: RequestContext, replica: int) -> None:
        self._act(replica).prefill.pop(ctx.request_id, None)

    def on_finish(self, ctx: RequestContext, replica: int) -> None:
        a = self._act(replica)
        a.prefill.pop(ctx.request_id, None)
        keys = a.requests.pop(ctx.request_id, None)
        if keys:
            a.blocks.subtract(keys)
            for k in keys:
                if a.blocks[k] <= 0:
                    del a.blocks[k]

    def on_kv_event(self, replica: int, event: Any) -> None:
        self.index.apply_event(replica, event)

    def on_replica_removed(self, replica: int) -> None:
        self.index.clear(replica)
        self.active.pop(replica, None)

    def predicted_hit_blocks(self, ctx: RequestContext, replica: int) -> int:
        return self.index.match_len(replica, ctx.keys)


ROUTERS = {"dynamo_kv": lambda **params: DynamoKVRouter(**params)}
