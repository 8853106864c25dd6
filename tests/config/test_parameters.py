"""The one table of policy parameter names (anchorage.config.parameters) against every
other place that names them: the policies' own validation, the tuner's flat view, the CRD
and the docs. Each test fails when one of them drifts from the table."""

from __future__ import annotations

import math
import re

import pytest
import yaml

from anchorage.autoscale.params import POLICY_KWARGS, flatten, policy_kwargs, unflatten
from anchorage.config.parameters import (PARAMETERS, TUNABLE, ConfigError, PolicyParameters,
                                         policy_tuning)
from tests.conftest import REPO

CRD = REPO / "manifests" / "crd" / "agentcachepolicies.anchorage.dev.yaml"


def _spec_schema() -> dict:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_table_names_are_the_policies_tuning_parameters_with_their_defaults():
    defaults, _ = policy_tuning()
    assert {POLICY_KWARGS[f] for f in POLICY_KWARGS} == set(defaults)
    for p in PARAMETERS.values():
        pol_default = defaults[POLICY_KWARGS[p.flat]]
        if pol_default is None:          # recency_scale_s: None means inf
            pol_default = math.inf
        assert p.default == pol_default, p.kwarg


@pytest.mark.parametrize("name", list(PARAMETERS))
def test_table_ranges_are_the_policies_ranges(name):
    """The policies accept exactly the values the document accepts: probe each bound."""
    _, check = policy_tuning()
    p = PARAMETERS[name]
    kw = POLICY_KWARGS[p.flat]
    if p.kind is bool:
        probes = [True, False, 1, "yes"]
    else:
        lo, hi = p.minimum, p.maximum
        probes = [lo, lo - 1e-9, lo + 1e-9, hi, hi + 1.0, (lo + min(hi, lo + 10)) / 2, "x",
                  float("nan"), True]
    for v in probes:
        try:
            check(**{kw: v})
            pol_ok = True
        except (TypeError, ValueError):
            pol_ok = False
        try:
            PolicyParameters(**{name: v})
            doc_ok = True
        except ConfigError:
            doc_ok = False
        assert pol_ok == doc_ok, (name, v, pol_ok, doc_ok)


def test_tuner_names_come_from_the_table():
    assert set(POLICY_KWARGS) == {p.flat for p in PARAMETERS.values()}
    crd = {"survivalThreshold": 0.3, "horizon": 60, "prefetch": {"enabled": True,
                                                                 "ratePerSecond": 2}}
    assert unflatten(flatten(crd)) == crd
    assert PolicyParameters.from_flat(flatten(crd)) == PolicyParameters.from_crd(crd)
    assert policy_kwargs(flatten(crd)) == PolicyParameters.from_crd(crd).policy_kwargs()
    assert PolicyParameters.from_crd(crd).to_crd() == crd


def test_crd_parameters_are_the_table_within_its_ranges():
    params = _spec_schema()["properties"]["policy"]["properties"]["parameters"]

    def leaves(node, path=()):
        for k, child in node["properties"].items():
            if child.get("type") == "object":
                yield from leaves(child, path + (k,))
            else:
                yield path + (k,), child

    crd = dict(leaves(params))
    assert set(crd) == {p.path for p in PARAMETERS.values()}
    assert not params.get("x-kubernetes-preserve-unknown-fields")   # closed: names are exact
    for p in PARAMETERS.values():
        node = crd[p.path]
        assert node["type"] == ("boolean" if p.kind is bool else "number"), p.path
        if p.kind is bool:
            continue
        lo, hi = node.get("minimum", -math.inf), node.get("maximum", math.inf)
        assert lo > p.minimum if p.exclusive_minimum else lo >= p.minimum, p.path
        assert hi <= p.maximum, p.path
    tunable = _spec_schema()["properties"]["tuning"]["properties"]["parameters"]["items"]
    assert tunable["properties"]["name"]["enum"] == list(TUNABLE)


def test_docs_table_lists_every_parameter():
    text = (REPO / "docs" / "autoscaling.md").read_text()
    rows = re.findall(r"^\| `([\w.]+)` \| `(\w+)` \| ([^|]+) \| ([^|]+) \|", text, re.M)
    assert {r[0] for r in rows} == {p.dotted for p in PARAMETERS.values()}
    for dotted, kwarg, rng, default in rows:
        p = next(q for q in PARAMETERS.values() if q.dotted == dotted)
        assert kwarg == POLICY_KWARGS[p.flat], (dotted, kwarg)
        assert rng.strip() == p.range_text(), (dotted, rng)
        want = str(p.default).lower() if p.kind is bool else f"{p.default:g}"
        assert default.strip() == want, (dotted, default)


def test_warmup_overrides_name_warmup_config_fields():
    import dataclasses

    from anchorage.warmup import WarmupConfig

    names = {f.name for f in dataclasses.fields(WarmupConfig)}
    over = PolicyParameters(r_min=0.5, prefetch_enabled=False, prefetch_rate_per_s=1).warmup_overrides()
    assert over == {"r_min": 0.5, "enabled": False, "rate_per_s": 1.0}
    assert set(over) <= names
    dataclasses.replace(WarmupConfig(), **over)   # the sidecar applies exactly this


def test_bad_parameters_name_the_field():
    with pytest.raises(ConfigError, match=r"policy.parameters.prefetch.ratePerSecond: must be in"):
        PolicyParameters.from_crd({"prefetch": {"ratePerSecond": -1}})
    with pytest.raises(ConfigError, match=r"policy.parameters.prefetch.rate: unknown parameter"):
        PolicyParameters.from_crd({"prefetch": {"rate": 1}})
    with pytest.raises(ConfigError, match="unknown policy parameter.*ttl_s"):
        PolicyParameters.from_flat({"ttl_s": 1.0})
