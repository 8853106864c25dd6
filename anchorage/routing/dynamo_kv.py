"""``dynamo_kv``: NVIDIA Dynamo's KV router (``--router-mode kv``), its default worker
selector.

Spec (ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs`` ``DefaultWorkerSelector``,
``softmax_sample``; ``sequence.rs`` ``potential_blocks_and_tokens``; documented in
``docs/router/kv_cache_routing.md``, "Cost Calculation"), per request with ``isl`` prompt
tokens and keys ``K`` (``b`` tokens per block), for each healthy worker ``w``:

- ``overlap_w`` = leading blocks of ``K`` cached on ``w``, from the workers' KV events
  (``BlockStored`` / ``BlockRemoved``; Dynamo's ``KvIndexer`` radix tree);
- ``prefill_tokens_w = active_prefill_w + max(isl - overlap_w * b, 0)``: the router's own
  count of prefill tokens it sent to ``w`` whose first token has not come back
  (``add_request`` adds each request's new tokens, ``mark_prefill_completed`` removes
  them), plus this request's;
- ``decode_blocks_w = active_blocks_w + new_blocks_w``: the distinct blocks of the requests
  in flight on ``w`` (the router's slot manager, by block hash) plus the request's blocks
  not among them;
- ``logit_w = overlap_score_weight * prefill_tokens_w / b + decode_blocks_w``;
- selection: ``temperature = 0``: the minimum logit (ties within 1e-5: the smaller radix
  tree, i.e. fewer indexed blocks, then the lower index); ``temperature > 0``: softmax
  sampling over ``-logit_w / (max - min) / temperature`` (uniform when all are equal).

On routing (``on_start``) the request joins ``w``'s active set; ``on_first_token`` marks
its prefill complete; ``on_finish`` frees it. Parameters (Dynamo's defaults):
``overlap_score_weight`` 1.0 (``--kv-overlap-score-weight``), ``temperature`` 0.0
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
from anchorage.routing.prefix_index import PrefixIndex, held_prefix_len

TIE_EPSILON = 1e-5


def dynamo_logit(isl: int, overlap_blocks: int, block_size: int, active_prefill_tokens: int,
                 active_blocks: int, new_blocks: int, overlap_score_weight: float = 1.0) -> float:
    """The selector's cost of one worker (lower is better)."""
    prefill = active_prefill_tokens + max(isl - overlap_blocks * block_size, 0)
    return overlap_score_weight * prefill / block_size + active_blocks + new_blocks


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

    def __init__(self, overlap_score_weight: float = 1.0, temperature: float = 0.0,
                 block_size: int = 0, seed: int = 0) -> None:
        if overlap_score_weight < 0 or temperature < 0 or block_size < 0:
            raise ValueError("overlap_score_weight, temperature and block_size must be >= 0")
        self.overlap_score_weight = float(overlap_score_weight)
        self.temperature = float(temperature)
        self.block_size = int(block_size)
        self.index = PrefixIndex(None)
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
        matches = self.index.match(ctx.keys) if ctx.keys else {}
        out = []
        for p in pos:
            w = replicas[p].index
            a = self._act(w)
            out.append(dynamo_logit(ctx.input_length, matches.get(w, 0), bs,
                                    a.prefill_tokens, len(a.blocks), a.new_blocks(ctx.keys),
                                    self.overlap_score_weight))
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
        overlap = self.index.match_len(replica, keys) if keys else 0
        a.prefill[rid] = max(ctx.input_length - overlap * self._bs(ctx), 0)
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
