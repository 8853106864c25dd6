"""Every policy through the BlockPool patch on vLLM 0.32's real KV cache manager, when
vLLM allocates without a prefix lookup first (``allocate_slots`` with no prior
``get_computed_blocks``: its connector path, and vLLM's own upstream tests): the policy
never hears of those requests, yet gets their blocks' hits, frees and evictions. No policy
may fail there (a failure is a stock-order decision, counted in ``driver.errors``)."""

from __future__ import annotations

import pytest

from anchorage.policies.registry import make_policy, policy_names
from tests.node_agent.test_block_pool_patch import consistent, drive, patch  # noqa: F401
from tests.pool.vllm_side import VllmSide, vllm_kv  # noqa: F401 (fixture)


class ConnectorSide(VllmSide):
    """Admits every other request the way the connector path does: no prefix lookup."""

    def admit(self, r, tokens):
        if r.rid % 2:
            return super().admit(r, tokens)
        req = self.v.Request(str(r.rid), tokens,
                             self.v.SamplingParams(max_tokens=max(1, r.output_len)), None,
                             block_hasher=self.hasher)
        if self.mgr.allocate_slots(req, r.prompt_len) is None:
            return None
        req.num_computed_tokens = r.prompt_len
        self.reqs[r.rid] = req
        return 0


@pytest.mark.parametrize("name", policy_names(include_offline=False))
def test_allocation_without_a_prefix_lookup_is_no_policy_error(vllm_kv, patch, name):  # noqa: F811
    side = ConnectorSide(vllm_kv, 20, 4)
    driver = patch.attach(side.pool, make_policy(name, block_size=4))
    before = patch.stats().victims
    for seed in (5, 6):
        drive(vllm_kv, [side], seed, 4, 20, check=consistent)
    assert driver.errors == 0
    assert patch.stats().victims > before, "no victim came from the policy"
