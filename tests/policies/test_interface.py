"""The declared seams of a policy: the ``PoolView`` protocol (what a policy may read of a
pool), satisfied by the simulator's pool and the engine's view of vLLM's pool; and the
introspection interface of ``EvictionPolicy``, the only thing code outside
``anchorage/policies/`` reads of a policy."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from anchorage.policies.base import EvictionPolicy, PoolView, RequestContext
from anchorage.policies.cachescout import PrefetchAdvisor
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from anchorage.tiering.eviction import TieredEviction
from tests.policies.agent_workload import pipeline_workload
from tests.pool.vllm_side import VllmSide, vllm_kv  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
#: everything a reader may touch: the protocol's methods, ``name``, ``pool``, ``offline``
INTERFACE = frozenset(n for n in dir(EvictionPolicy) if not n.startswith("_"))


def _check_view(view, capacity: int, block_size: int) -> None:
    assert isinstance(view, PoolView)
    assert view.capacity_blocks == capacity and view.block_size == block_size
    assert view.num_free_blocks == capacity
    assert view.blocks_needed(block_size + 1) == 2
    assert view.get_cached_block(("nothing", 1)) is None and ("nothing", 1) not in view.cached
    assert all(view.block_key[b] is None and view.ref_cnt[b] == 0
               for b in range(1, capacity + 1))


def test_the_simulator_pool_is_a_pool_view():
    pool = BlockPool(8, 4, make_policy("lru"))
    _check_view(pool, 8, 4)
    a = pool.allocate(RequestContext(request_id=1, keys=["k0"], input_length=5))
    b = pool.get_cached_block("k0")
    assert "k0" in pool.cached and pool.block_key[b] == "k0" and pool.ref_cnt[b] == 1
    pool.free(a)
    assert pool.ref_cnt[b] == 0


def test_the_engine_view_of_vllms_pool_is_a_pool_view(vllm_kv):  # noqa: F811
    from anchorage.node_agent.vllm_block_pool import PoolView as EngineView

    side = VllmSide(vllm_kv, 8, 4)
    _check_view(EngineView(side.pool), 8, 4)


def test_a_bare_object_is_not_a_pool_view():
    assert not isinstance(object(), PoolView)


def strict(policy: EvictionPolicy) -> EvictionPolicy:
    """``policy`` behind a class that has only the interface: any other attribute a
    reader touches is an AttributeError."""

    def forward(name):
        return lambda self, *a, **k: getattr(self._inner, name)(*a, **k)

    ns = {n: forward(n) for n in INTERFACE if callable(getattr(EvictionPolicy, n))}
    ns["__getattr__"] = lambda self, n: (getattr(self._inner, n) if n in INTERFACE
                                         else _refuse(n))
    ns["__init__"] = lambda self, inner: object.__setattr__(self, "_inner", inner)
    return type("Strict", (), ns)(policy)


def _refuse(name: str):
    raise AttributeError(f"{name!r} is not part of the policy interface")


def _replayed(name: str = "hybrid"):
    ctxs = pipeline_workload(seed=2, agents=4, sessions=20, steps=6)
    real, facade = make_policy(name, block_size=16), make_policy(name, block_size=16)
    return ctxs, real, strict(facade)


def test_the_node_state_and_exporter_read_only_the_interface():
    from anchorage.node_agent.state import NodeState, policy_view

    ctxs, real, facade = _replayed()
    states = []
    for pol in (real, facade):
        pool, st = BlockPool(200, 16, pol), NodeState(block_size=16)
        for i, c in enumerate(ctxs):
            a = pool.allocate(c)
            st.observe(pol, c, list(range(c.input_length)), now_s=float(i))
            pool.free(a)
        states.append((dict(st.predictions), len(st.anchors.entries), policy_view(pol)))
    assert states[0] == states[1]
    assert states[0][2]["predictability"] > 0 and states[0][2]["predictions"]


def test_the_prefetch_advisor_reads_only_the_interface():
    ctxs, real, facade = _replayed("cachescout")
    out = []
    for pol in (real, facade):
        pool = BlockPool(200, 16, pol)
        for c in ctxs:
            pool.free(pool.allocate(c))
        adv = PrefetchAdvisor(pol)
        out.append(([adv.advise(s) for s in ("s0", "s1", "nobody")], adv.warm_candidates(3),
                    adv.budget(2.0), adv.r_min))
    assert out[0] == out[1]
    assert out[0][0][0].next_agent is not None


def test_the_tiering_wrapper_forwards_exactly_the_interface():
    ctxs, real, facade = _replayed()
    tiered = TieredEviction(facade, lambda c: c.session_id)
    assert not hasattr(TieredEviction, "__getattr__")
    pool = BlockPool(200, 16, tiered)
    for c in ctxs:
        pool.free(pool.allocate(c))
    other = BlockPool(200, 16, real)
    for c in ctxs:
        other.free(other.allocate(c))
    assert tiered.protected_blocks() == real.protected_blocks()
    assert tiered.predicted_agents(3) == real.predicted_agents(3)
    assert tiered.learned_counts() == real.learned_counts()
    assert tiered.state_size_bytes() == real.state_size_bytes() > 0
    assert tiered.tiering_view() is None and tiered.anchor_labels() is None
    with pytest.raises(AttributeError):
        tiered.sessions  # noqa: B018 (nothing is forwarded beyond the interface)


def test_a_policy_that_learns_nothing_answers_with_defaults():
    pol = make_policy("lru")
    assert pol.last_request() is None and pol.fingerprint_of(["k"]) is None
    assert pol.predictability() == 0.0 and pol.predicted_agents(3) == []
    assert pol.protected_blocks() == {"anchor": 0, "session": 0}
    s = pol.prefetch_settings()
    assert s.enabled and s.rate_per_s == math.inf and s.r_min == 0.0


# -- nothing outside anchorage/policies/ reads a policy's internals -------------------------

#: names that hold a policy in the code base (``self.policy``, ``pool.policy``, ``inner``...)
POLICY_NAMES = {"policy", "pol", "inner"}
#: the learned state a policy used to expose as attributes, now behind the interface
LEARNED = {"trans", "sessions", "agents", "at_agent", "prefix", "gaps", "stay", "step_gap",
           "model", "heap", "view", "sig", "config"}


def _policy_reads(tree: ast.AST):
    for node in ast.walk(tree):
        target = attr = None
        if isinstance(node, ast.Attribute):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)):
            target, attr = node.args[0], node.args[1].value
        if target is None or not isinstance(attr, str):
            continue
        term = (target.id if isinstance(target, ast.Name)
                else target.attr if isinstance(target, ast.Attribute) else None)
        if term in POLICY_NAMES and not attr.startswith("__"):
            yield node.lineno, attr


def test_no_reader_outside_the_policies_touches_policy_internals():
    bad = []
    for top in ("anchorage", "node_agent", "router", "operator", "bench"):
        for f in sorted((ROOT / top).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if rel.startswith("anchorage/policies/"):
                continue
            for line, attr in _policy_reads(ast.parse(f.read_text(), rel)):
                if attr.startswith("_") or attr in LEARNED:
                    bad.append(f"{rel}:{line}: .{attr}")
    assert not bad, "policy internals read outside anchorage/policies/:\n" + "\n".join(bad)


def test_the_scan_sees_an_internal_read():
    tree = ast.parse("x = self.policy._cur\ny = getattr(policy, 'trans', None)\n"
                     "z = pol.sessions\nok = policy.last_request()")
    assert [a for _, a in _policy_reads(tree)] == ["_cur", "trans", "sessions",
                                                   "last_request"]
