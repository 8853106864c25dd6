"""A tiny multi-agent workload with known structure, for the agent-aware policy tests: the
toy generator (``anchorage.trace.toy``) with these tests' sizes and tools."""

from __future__ import annotations

from anchorage.policies.base import RequestContext
from anchorage.trace.toy import toy_multiagent, unique_blocks

__all__ = ["pipeline_workload", "unique_blocks"]


def pipeline_workload(seed: int = 0, agents: int = 4, sessions: int = 30, steps: int = 8,
                      horizon_s: float = 600.0, anchor_blocks: int = 8, turn_blocks: int = 3,
                      block_size: int = 16, tools: bool = True, output_length: int = 32,
                      topology: str = "pipeline") -> list[RequestContext]:
    """Sessions walk agents (pipeline: 0 -> 1 -> ...; random: uniform) from a random first
    agent. Gaps depend on the tool: ``read`` short, ``test`` long."""
    return toy_multiagent(topology, seed, agents=agents, sessions=sessions, steps=steps,
                          horizon_s=horizon_s, anchor_blocks=anchor_blocks,
                          turn_blocks=turn_blocks, block_size=block_size, tools=tools,
                          tool_gaps={"read": 0.5, "test": 30.0}, gap_base_s=1.0,
                          gap_sigma=0.3, random_start=True, output_length=output_length,
                          tool_paths=True)
