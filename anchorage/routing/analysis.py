"""Where a fleet's prefix-cache misses come from: a pure decomposition for placement studies.

Specification
-------------
Input: the requests of a run in admission order, each as ``(keys, replica, hit_blocks,
group)``: its chained block keys, the replica that served it, the leading blocks it found
cached there, and a group id (the session) used only to tell shared blocks apart. Over
all requests, with ``n = len(keys)``:

- ``g``: the longest prefix of ``keys`` that any earlier request held (any replica);
- ``l``: the longest prefix that an earlier request on the *same* replica held (``<= g``);
- ``h = min(hit_blocks, g)`` (a simulator counts a preempted request's hits once per
  attempt; what no earlier request held cannot be a hit);
- ``compulsory += n - g`` (nobody computed it before: no placement or cache size helps);
- ``placement += g - max(l, h)`` (only another replica had it: the router sent the
  request away from its prefix);
- ``capacity += max(l, h) - h`` (this replica had it and evicted it, or was still
  computing it: its cache was too small for what it was asked to hold);
- ``anchor_placement`` / ``anchor_capacity``: the parts of those two on blocks whose key
  appears in more than one group (prefixes shared across sessions: agents' anchors).

Each is returned as a share of all prompt blocks, with ``hit`` (sum of ``h``), so ``hit +
compulsory + placement + capacity = 1``. A single shared cache (every request on one
replica) has ``placement = 0`` by definition. Also returned: ``thread_moves``, the
requests whose thread (group, first key) was last served by another replica, and
``threads`` (requests that continued a thread).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Hashable, Iterable, Sequence


def miss_decomposition(requests: Iterable[tuple[Sequence[Hashable], int, int, Hashable]]
                       ) -> dict[str, float]:
    reqs = list(requests)
    groups: dict[Hashable, set] = defaultdict(set)
    for keys, _, _, g in reqs:
        for k in keys:
            groups[k].add(g)
    seen: set = set()
    seen_at: dict[int, set] = defaultdict(set)
    last: dict[tuple, int] = {}
    tot = hit = comp = plc = cap = plc_a = cap_a = 0
    moves = threads = 0
    for keys, rep, hit_blocks, g in reqs:
        n = len(keys)
        here = seen_at[rep]
        gl = 0
        while gl < n and keys[gl] in seen:
            gl += 1
        ll = 0
        while ll < gl and keys[ll] in here:
            ll += 1
        h = min(max(hit_blocks, 0), gl)
        top = max(ll, h)
        tot += n
        hit += h
        comp += n - gl
        plc += gl - top
        cap += top - h
        plc_a += sum(1 for k in keys[top:gl] if len(groups[k]) > 1)
        cap_a += sum(1 for k in keys[h:ll] if len(groups[k]) > 1)
        if n:
            t = (g, keys[0])
            if t in last:
                threads += 1
                moves += last[t] != rep
            last[t] = rep
        seen.update(keys)
        here.update(keys)
    d = tot or 1
    return {"prompt_blocks": tot, "hit": hit / d, "compulsory": comp / d,
            "placement": plc / d, "capacity": cap / d, "anchor_placement": plc_a / d,
            "anchor_capacity": cap_a / d, "thread_moves": moves, "threads": threads}
