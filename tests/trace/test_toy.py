"""anchorage.trace.toy: the toy multi-agent workload's structure (anchors, threads,
topologies, tools) and determinism."""

from __future__ import annotations

from anchorage.trace.toy import toy_multiagent, unique_blocks


def test_deterministic_and_time_ordered():
    a = toy_multiagent("pipeline", 3, sessions=20)
    b = toy_multiagent("pipeline", 3, sessions=20)
    assert [(c.keys, c.now_s, c.session_id, c.tool_name) for c in a] == \
        [(c.keys, c.now_s, c.session_id, c.tool_name) for c in b]
    assert [c.now_s for c in a] == sorted(c.now_s for c in a)
    assert [c.request_id for c in a] == list(range(len(a))) == [c.seq for c in a]
    assert len(a) == 20 * 10


def test_anchors_share_a_preamble_and_threads_extend_their_prompt():
    ctxs = toy_multiagent("random", 1, agents=4, sessions=30, anchor_blocks=6, turn_blocks=2)
    first = {}
    for c in ctxs:
        first.setdefault(c.agent_truth, c.keys[:6])
    anchors = list(first.values())
    assert all(a[:2] == anchors[0][:2] for a in anchors)        # shared preamble
    assert len({tuple(a[2:]) for a in anchors}) == len(anchors)  # each agent's own
    by_thread: dict = {}
    for c in ctxs:
        prev = by_thread.get((c.session_id, c.agent_truth))
        if prev is not None:  # an agent's next prompt in a session extends its last one
            assert c.keys[:len(prev)] == prev and len(c.keys) == len(prev) + 2
        by_thread[(c.session_id, c.agent_truth)] = c.keys
        assert c.input_length == len(c.keys) * 16
    assert unique_blocks(ctxs) == len({k for c in ctxs for k in c.keys})


def test_topologies_walk_as_specified():
    def walks(topology, **kw):
        out: dict = {}
        for c in sorted(toy_multiagent(topology, 2, agents=5, sessions=10, **kw),
                        key=lambda c: (c.session_id, c.now_s)):
            out.setdefault(c.session_id, []).append(int(c.agent_truth[1:]))
        return list(out.values())

    for w in walks("pipeline"):
        assert w == [i % 5 for i in range(10)]
    for w in walks("selector"):
        assert w[0::2] == [0] * 5 and all(a != 0 for a in w[1::2])
    starts = {w[0] for w in walks("pipeline", random_start=True)}
    assert len(starts) > 1


def test_tools_and_gaps():
    ctxs = toy_multiagent("pipeline", 0, sessions=5, tool_gaps={"read": 0.5, "test": 30.0},
                          tool_paths=True, output_length=8)
    assert {c.tool_name for c in ctxs} == {"read", "test"}
    assert all(c.tool_args == {"path": f"f{c.agent_truth[1:]}.py"} for c in ctxs)
    assert {c.output_length for c in ctxs} == {8}
    plain = toy_multiagent("pipeline", 0, sessions=5, tools=False)
    assert {c.tool_name for c in plain} == {None} and {c.tool_args for c in plain} == {None}
