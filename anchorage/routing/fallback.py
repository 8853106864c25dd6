"""Ranked fallbacks: where a request goes when its picked replica cannot take it.

Spec. The endpoint picker (``router/epp.py``) answers a gateway with the policy's choice
followed by an ordered list of fallbacks (the Inference Extension's endpoint-picker
protocol: ``x-gateway-destination-endpoint: a,b,c``; the gateway walks the list on a
connect failure). The policy decides the first entry; a policy's ``pick`` may record
state (the ``agent`` router binds the session, grows the agent's members), so it is never
called again for the others. The fallbacks are ranked by a pure rule instead:

    cost(r) = load_score(r) - matched_blocks(r) * tokens_per_key / tokens_per_request

(lowest first; ties by load, then by the replica's stable index): the replica whose
cached prefix of this request saves most prefill relative to its queue, in request
equivalents, which is the exchange rate the ``agent`` router weighs its members by.
``matched_blocks`` is the policy's own estimate (``Router.predicted_hit_blocks``: 0 for
policies without a cache model, which makes this least-loaded).

Parameters: ``k`` (how many fallbacks; 0 = none), ``tokens_per_request`` (default
``load.TOKENS_PER_REQUEST``; 0: matches rank first, then load). Unhealthy replicas and
the ``exclude`` set (the chosen one, replicas outside the gateway's subset hint) are
never listed.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from anchorage.routing.base import ReplicaView
from anchorage.routing.load import TOKENS_PER_REQUEST, load_scores


def rank_fallbacks(views: Sequence[ReplicaView], matched_blocks: Mapping[int, int],
                   tokens_per_key: float, exclude: Iterable[int] = (), k: int = 2,
                   tokens_per_request: float = TOKENS_PER_REQUEST) -> list[int]:
    """The ``index`` of up to ``k`` fallback replicas, best first."""
    if k <= 0:
        return []
    ex = set(exclude)
    load = load_scores(views, 1.0, tokens_per_request)
    rate = tokens_per_key / tokens_per_request if tokens_per_request > 0 else 0.0
    ranked = []
    for p, v in enumerate(views):
        if not v.healthy or v.index in ex:
            continue
        m = matched_blocks.get(v.index, 0)
        cost = load[p] - m * rate if rate else (-m, load[p])
        ranked.append((cost, load[p], v.index))
    ranked.sort()
    return [i for _, _, i in ranked[:k]]
