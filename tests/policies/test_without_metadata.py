"""hybrid without request metadata, driven through the core's vLLM-faithful pool: no
session id, no agent, no tool name, requests back to back on a clock that only advances
(as ``LLM.generate`` or a plain OpenAI client sends them; the clock starts far from 0, as
monotonic time does). An agent anchor that several inferred sessions reuse survives a
flood of single-use prompts three times the pool under hybrid; LRU loses it. The pool is
sized like the engine tests' (39 blocks of 32 tokens; tests/node_agent/test_engine_hybrid.py
runs the same scenarios in vLLM)."""

from __future__ import annotations

import itertools

import pytest

from anchorage.policies.base import RequestContext
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool

BS = 32
CAPACITY = 39
ANCHOR = list(range(1, 9))  # 8 blocks: system prompt and tools
STEP_S = 0.05               # an admission or a completion


class Client:
    """Prompts of whole blocks plus 5 tokens (the partial block is never cached), one
    generated token each; ``generate`` admits up to ``in_flight`` at once, then frees
    them, like one ``LLM.generate`` call with that many running sequences."""

    def __init__(self, policy: str):
        self.pool = BlockPool(CAPACITY, BS, make_policy(policy, block_size=BS))
        self.now = 5000.0
        self.ids = itertools.count()

    def _ctx(self, rid: int, keys: list[int]) -> RequestContext:
        self.now += STEP_S
        return RequestContext(request_id=rid, keys=keys, input_length=len(keys) * BS + 5,
                              now_s=self.now)

    def generate(self, prompts: list[list[int]], in_flight: int = 1) -> list[int]:
        """Cached blocks per prompt."""
        hits = []
        for i in range(0, len(prompts), in_flight):
            running = []
            for keys in prompts[i:i + in_flight]:
                ctx = self._ctx(next(self.ids), list(keys))
                a = self.pool.allocate(ctx, ctx.input_length + 1)
                assert a is not None
                hits.append(a.hit_blocks)
                running.append(a)
            for a in running:
                a.ctx = self._ctx(a.ctx.request_id, a.ctx.keys)  # done now
                self.pool.free(a)
        return hits


def one_shot_calls(client: Client, fresh) -> None:
    """12 calls of the agent, each a new conversation: 12 inferred one-request sessions."""
    for _ in range(12):
        client.generate([ANCHOR + [next(fresh)]])


def three_one_shot_calls(client: Client, fresh) -> None:
    """3 calls only: once shared, the anchor has 2 arrivals, too few for the anchor scorer
    (``min_arrivals``); it is kept because the flood's one-request sessions are learnt
    not to return (``first_return``) and re-scored the moment that is learnt."""
    for _ in range(3):
        client.generate([ANCHOR + [next(fresh)]])


def conversations(client: Client, fresh) -> None:
    """3 conversations of 2 turns: the second turn extends the first's prompt, so each is
    one inferred session of two requests."""
    for _ in range(3):
        turn = ANCHOR + [next(fresh)]
        client.generate([turn])
        assert client.generate([turn + [next(fresh)]]) == [len(turn)]


def anchor_after_flood(policy: str, reuse, flood_blocks: int, in_flight: int) -> int:
    """Cached blocks of the agent's next call after ``reuse`` and the flood."""
    client = Client(policy)
    fresh = itertools.count(100)
    reuse(client, fresh)
    flood = [[next(fresh) for _ in range(flood_blocks)]
             for _ in range(3 * CAPACITY // flood_blocks)]
    assert client.generate(flood, in_flight) == [0] * len(flood)  # single-use
    return client.generate([ANCHOR + [next(fresh)]])[0]


@pytest.mark.parametrize("reuse", [one_shot_calls, three_one_shot_calls, conversations])
@pytest.mark.parametrize("flood_blocks,in_flight", [(8, 1), (4, 1), (4, 4)])
def test_an_anchor_reused_without_metadata_survives_a_flood(reuse, flood_blocks, in_flight):
    assert anchor_after_flood("lru", reuse, flood_blocks, in_flight) == 0, \
        "the flood did not evict the anchor under LRU"
    got = anchor_after_flood("hybrid", reuse, flood_blocks, in_flight)
    assert got >= len(ANCHOR), f"hybrid lost the anchor: {got} blocks cached"
