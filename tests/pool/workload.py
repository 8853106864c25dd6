"""Small agent-like request sequences for block-pool tests (fidelity and properties).

Prompts are chains of block keys with vLLM's prefix semantics: a key is a node of a trie
of block contents, so an equal key at position i means the same prompt through block i.
Each request is ``agent anchor + session task + growing session history``, with exact
resends (duplicate prompts: the hit is capped one block short, so the last full block is
recomputed and cached twice), truncated prefixes, unrelated one-off prompts and partial
last blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Req:
    rid: int
    keys: list[int]  # one key per prompt block, the partial last block included
    prompt_len: int  # tokens
    output_len: int  # tokens sampled; output_len - 1 of them get a KV slot
    session: str | None = None


@dataclass
class KeyTrie:
    """Block keys as trie nodes: ``(parent key, content label) -> key``."""

    nodes: dict[tuple, int] = field(default_factory=dict)

    def chain(self, labels: list) -> list[int]:
        out, parent = [], -1
        for lab in labels:
            k = self.nodes.get((parent, lab))
            if k is None:
                k = self.nodes[(parent, lab)] = len(self.nodes)
            out.append(k)
            parent = k
        return out


def agent_workload(rng: random.Random, block_size: int, n_requests: int, *,
                   n_agents: int = 3, n_sessions: int = 4, max_anchor_blocks: int = 5,
                   max_output_blocks: int = 3) -> list[Req]:
    trie = KeyTrie()
    anchors = [[("anchor", a, j) for j in range(rng.randint(1, max_anchor_blocks))]
               for a in range(n_agents)]
    tasks = [[("task", s, j) for j in range(rng.randint(1, 2))] for s in range(n_sessions)]
    history: list[list] = [[] for _ in range(n_sessions)]
    sent: list[Req] = []
    fresh = 0
    out: list[Req] = []
    for rid in range(n_requests):
        u = rng.random()
        session = None
        if sent and u < 0.1:  # exact resend of an earlier prompt
            prev = rng.choice(sent)
            keys, prompt_len, session = list(prev.keys), prev.prompt_len, prev.session
        elif sent and u < 0.2:  # a truncated earlier prompt (shares a prefix, shorter)
            prev = rng.choice(sent)
            nfull = prev.prompt_len // block_size
            n = rng.randint(1, max(1, nfull))
            keys, prompt_len = prev.keys[:n], n * block_size
        elif u < 0.3:  # an unrelated one-off prompt
            fresh += 1
            labels = [("oneoff", fresh, j) for j in range(rng.randint(1, 6))]
            keys = trie.chain(labels)
            prompt_len = len(keys) * block_size - rng.randrange(block_size)
        else:  # an agent turn in a session
            s = rng.randrange(n_sessions)
            a = rng.randrange(n_agents)
            history[s] += [("hist", s, rid, j) for j in range(rng.randint(0, 3))]
            labels = anchors[a] + tasks[s] + history[s]
            tail = rng.randrange(block_size) if rng.random() < 0.5 else 0
            if tail:
                labels = labels + [("tail", rid)]
            keys = trie.chain(labels)
            prompt_len = (len(keys) - (1 if tail else 0)) * block_size + tail
            session = f"s{s}"
        out_len = rng.randint(1, max_output_blocks * block_size)
        req = Req(rid, keys, prompt_len, out_len, session)
        sent.append(req)
        out.append(req)
    return out


def token_blocks(rng: random.Random, block_size: int):
    """A fixed random token block per key (lazily drawn, deterministic for one rng)."""
    table: dict[int, list[int]] = {}

    def tokens(keys: list[int], prompt_len: int) -> list[int]:
        toks: list[int] = []
        for k in keys:
            blk = table.get(k)
            if blk is None:
                blk = table[k] = [rng.randrange(1, 30000) for _ in range(block_size)]
            toks.extend(blk)
        return toks[:prompt_len]

    return tokens
