"""Group eviction's configuration: typed parameter sections that reject unknown names and
bad values, and presets that are nothing but configuration (a preset built by name equals
the same configuration written out, victim for victim)."""

from __future__ import annotations

import dataclasses

import pytest

from anchorage.policies.group import GroupConfig, GroupEvictionPolicy, ModelParams, Signals, Tuning
from anchorage.policies.group.config import build_config
from anchorage.policies.group.scorers.anchor import AnchorParams
from anchorage.policies.group.scorers.output import OutputParams
from anchorage.policies.group.scorers.stale import StaleParams
from anchorage.policies.group.scorers.thread import ThreadParams
from anchorage.policies.registry import make_policy
from anchorage.pool.block_pool import BlockPool
from tests.policies.agent_workload import pipeline_workload, unique_blocks

OFF = Signals(**{f.name: False for f in dataclasses.fields(Signals)})
SECTIONS = (Signals, Tuning, ModelParams, AnchorParams, ThreadParams, OutputParams, StaleParams)


@pytest.mark.parametrize("cls", SECTIONS)
def test_each_section_is_frozen_and_rejects_unknown_names(cls):
    p = cls()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(p, dataclasses.fields(cls)[0].name, None)
    with pytest.raises(TypeError, match="no_such_knob"):
        cls(no_such_knob=1)


@pytest.mark.parametrize("cls,field,value,msg", [
    (Signals, "tools", "yes", "tools must be true or false"),
    (ModelParams, "min_samples", 0, "min_samples must be an integer >= 1"),
    (ModelParams, "eps", 0.0, "eps must be in (0, inf]"),
    (ModelParams, "max_agents", 2.5, "max_agents must be an integer >= 1"),
    (ModelParams, "global_gaps", "sometimes", "global_gaps must be auto, wait, survival or off"),
    (ModelParams, "reach_steps", 1, "reach_steps must be 'turnover' or an int >= 2"),
    (AnchorParams, "min_arrivals", 0, "min_arrivals must be an integer >= 1"),
    (ThreadParams, "floor", 0.0, "floor must be in (0, 1]"),
    (OutputParams, "dead_max_reuse", 1.5, "dead_max_reuse must be in [0, 1]"),
    (StaleParams, "dead_min_samples", -1, "dead_min_samples must be an integer >= 0"),
    (Tuning, "horizon_s", -1.0, "horizon_s must be in (0, inf]"),
])
def test_bad_values_are_value_errors_naming_the_parameter(cls, field, value, msg):
    with pytest.raises(ValueError) as e:
        cls(**{field: value})
    assert msg in str(e.value)


@pytest.mark.parametrize("name", ["hybrid", "cachescout", "cachewise"])
def test_make_policy_names_an_unknown_parameter_and_rejects_bad_values(name):
    with pytest.raises(TypeError, match=f"policy '{name}' does not accept parameter 'gap_mode'"):
        make_policy(name, gap_mode="wait")
    with pytest.raises(ValueError, match="dead_max_reuse must be in"):
        make_policy(name, dead_max_reuse=-0.5)
    with pytest.raises(ValueError, match="end_factor must be in"):
        make_policy(name, end_factor=0)


def test_flat_parameters_reach_their_sections():
    cfg = build_config("x", block_size=32, min_samples=8, dead_min_samples=10,
                       survival_threshold=0.4, horizon_s=50.0, reach_steps="turnover")
    assert cfg.block_size == 32 and cfg.model.min_samples == 8
    assert cfg.model.reach_steps == "turnover"
    assert cfg.output.dead_min_samples == cfg.stale.dead_min_samples == 10
    assert (cfg.thread.survival_threshold, cfg.thread.horizon_s) == (0.4, 50.0)
    assert (cfg.anchor.survival_threshold, cfg.anchor.horizon_s) == (0.4, 50.0)
    assert cfg.tuning.recency_scale_s == float("inf")  # None means plain recency


def _victims(pol, ctxs, cap):
    pool = BlockPool(cap, 16, pol)
    order = []
    evict = pool._evict

    def record(b):
        order.append(b)
        evict(b)

    pool._evict = record
    pool._inline_evict = False
    for c in ctxs:
        pool.free(pool.allocate(c))
    return order


@pytest.mark.parametrize("name,signals", [
    ("hybrid", Signals()),
    ("cachescout", Signals(tools=False)),
    ("cachewise", Signals(anchors=False, transitions=False)),
])
def test_a_preset_is_its_configuration(name, signals):
    ctxs = pipeline_workload(seed=4, agents=4, sessions=30, steps=8)
    cap = unique_blocks(ctxs) // 8
    kw = dict(horizon_s=300.0, min_samples=8)
    preset = make_policy(name, block_size=16, **kw)
    cfg = build_config(name, signals, block_size=16,
                       cluster_fn=preset.config.cluster_fn, **kw)
    assert cfg == preset.config
    explicit = _victims(GroupEvictionPolicy(cfg), ctxs, cap)
    assert explicit and explicit == _victims(preset, ctxs, cap)
    # and the signals matter: without any, other victims (LRU's)
    assert _victims(GroupEvictionPolicy(build_config(name, OFF, **kw)), ctxs, cap) != explicit


def test_no_signal_at_all_is_lru():
    off = OFF
    ctxs = pipeline_workload(seed=5, agents=4, sessions=30, steps=8)
    cap = unique_blocks(ctxs) // 8
    none = GroupEvictionPolicy(GroupConfig(signals=off, anchor=AnchorParams(enabled=False,
                                                                           transitions=False),
                                           thread=ThreadParams(gaps=False, transitions=False),
                                           output=OutputParams(dead_outputs=False, gaps=False),
                                           stale=StaleParams(gaps=False)))
    assert _victims(none, ctxs, cap) == _victims(make_policy("lru"), ctxs, cap)
    assert none.config == build_config("group", off)
