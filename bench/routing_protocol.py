"""The routing benchmark's held-out protocol: where router parameters may be chosen, and
the test set no parameter is chosen on. Declared here, before any run.

- ``TUNING``: workloads of ``anchorage trace generate`` (the generator every parameter of
  the project has been tuned on), seed 1, 4 replicas, caches of 800 and 4,000 blocks per
  replica. ``agent``'s ``locality`` and ``request_tokens`` and its guard's window and margin
  were chosen here (``docs/research/routing.md``).
- ``TEST``: nothing is chosen on it; results are reported as measured.
  - the eight topologies of ``anchorage.trace.scenarios`` (a second generator, written apart:
    shared framework preambles, sub-agent sessions, whole-conversation hand-offs, fan-out
    bursts), each with its parameters drawn from ranges by a seed of its own (201-208);
  - fleets of 2 x 800 and 4 x 2,000 blocks per replica (caches below the working set) for
    every topology; 8 x 4,000 on three topologies and 16 x 2,000 on one, each with a seed of
    its own (211-213, 221);
  - the real traces: ChatDev (multi-agent software company) and WEKA's Claude Code sessions,
    each on 4 x 2,000.
- Every cell runs every router side by side, in the same process, on the same trace:
  ``ROUTERS`` (round robin, SGLang's cache-aware prefix, precise prefix over KV events,
  llm-d's precise-prefix profile, Dynamo's KV cost, ThunderAgent's program scheduler in
  front of round robin, ``agent``) and the ``pooled`` reference (one cache of the fleet's
  total size: what no placement beats).

A cell: ``Cell(workload, replicas, capacity_blocks)``; ``workload`` is ``scenario:<topology>:
<seed>``, ``generated:<topology>:<seed>`` or a real-trace spec of ``anchorage.workloads``.
Load: closed loop, sessions starting at their trace times, ``CONCURRENCY_PER_REPLICA``
concurrent top-level sessions per replica (about half the fleet's prefill capacity on the
``h200-llama3-8b`` profile at these prompt sizes: TTFT p50 tens of ms, p90 a second or two).
"""

from __future__ import annotations

from dataclasses import dataclass

from anchorage.trace.scenarios import TOPOLOGIES as SCENARIO_TOPOLOGIES

SESSIONS = 50
CONCURRENCY_PER_REPLICA = 2.0
PROFILE = "h200-llama3-8b"
BLOCK_SIZE = 16

#: router name -> (router, timed-config overrides); ThunderAgent is a program gate
ROUTERS = {
    "round_robin": ("round_robin", {}),
    "prefix": ("prefix", {}),
    "precise_prefix": ("precise_prefix", {}),
    "llm_d": ("llm_d", {}),
    "dynamo_kv": ("dynamo_kv", {}),
    "thunderagent": ("round_robin", {"program_gate": "thunderagent"}),
    "agent": ("agent", {}),
}
REFERENCE = "pooled"


@dataclass(frozen=True)
class Cell:
    workload: str
    replicas: int
    capacity_blocks: int

    @property
    def name(self) -> str:
        return f"{self.workload}@{self.replicas}x{self.capacity_blocks}"


TUNING_TOPOLOGIES = ("hierarchical", "handoff", "pipeline", "selector")
TUNING = tuple(Cell(f"generated:{t}:1", 4, cap)
               for t in TUNING_TOPOLOGIES for cap in (800, 4000))

_FLEETS = ((2, 800), (4, 2000))
TEST = tuple(
    [Cell(f"scenario:{t}:{201 + i}", n, cap)
     for i, t in enumerate(SCENARIO_TOPOLOGIES) for n, cap in _FLEETS]
    + [Cell(f"scenario:{t}:{211 + i}", 8, 4000)
       for i, t in enumerate(("hierarchical", "fanout", "debate"))]
    + [Cell("scenario:subagent:221", 16, 2000)]
    + [Cell("chatdev:1", 4, 2000), Cell("weka:1", 4, 2000)])

#: the topologies where one agent hands work to another (the +3 point goal's cells)
HANDING = ("hierarchical", "handoff", "pipeline")


def overlap() -> set[str]:
    """Workloads in both sets (must be empty: the protocol's own check)."""
    return {c.workload for c in TUNING} & {c.workload for c in TEST}
