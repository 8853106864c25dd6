"""The peer stacks' configurations, the memory hierarchy, the fleet metrics' summaries."""

from dataclasses import replace

import pytest

from anchorage.fleet.hierarchy import PCIE_GEN5_X16_GBS, MemoryHierarchy
from anchorage.fleet.spec import StackSpec, get_stack, stack_names
from anchorage.sim.profiles import get_profile
from bench.fleet_report import slo_capacity, summarize
from bench.fleet_workloads import coarsen


def test_every_peer_named_and_configured_as_it_ships():
    peers = set(stack_names("peer"))
    assert {"stock", "smg", "llm-d", "llm-d+offload", "llm-d-tiered", "dynamo",
            "dynamo+thunderagent", "production-stack", "continuum"} <= peers
    s = get_stack("smg")
    assert s.router == "prefix" and s.router_params["cache_threshold"] == 0.3
    assert s.router_params["balance_abs_threshold"] == 64
    assert s.router_params["balance_rel_threshold"] == 1.5
    assert s.router_params["tokens_per_request"] == 0       # SGLang counts requests
    assert get_stack("llm-d").router == "llm_d" and get_stack("llm-d").tiering == "off"
    assert get_stack("llm-d+offload").tiering == "store-all"
    d = get_stack("dynamo")
    assert d.router == "dynamo_kv" and d.tiering == "store-all"
    assert d.router_kwargs(256)["block_size"] == 256
    # KVBM: a merged device-tier view (full credit); vLLM's connector: tier-aware, 0.75
    assert d.router_params["host_cache_hit_weight"] == 1.0
    assert get_stack("dynamo-offloading").router_params["host_cache_hit_weight"] == 0.75
    t = get_stack("llm-d-tiered")
    assert t.router == "composite" and t.tiering == "store-all"
    kw = t.router_kwargs(256, 7000)       # the guide's CPU LRU: the replica's host tier
    assert [x["weight"] for x in kw["scorers"]] == [2.0, 2.0, 1.0, 1.0]
    assert kw["scorers"][3]["capacity_blocks"] == 7000
    with pytest.raises(ValueError, match="host tier"):
        t.router_kwargs(256)
    assert get_stack("dynamo+thunderagent").program_gate == "thunderagent"
    ps = get_stack("production-stack")
    assert ps.router == "session_affinity" and ps.tiering == "store-all"
    # LMCache's two connectors in vLLM 0.32: the async one (LMCacheMPConnector) is the row,
    # the sync one (LMCacheConnectorV1) a variant
    assert ps.tiering_params == {"sync_load_max_s": 0.0}
    sync = get_stack("production-stack-sync")
    assert sync.role == "ablation" and sync.tiering_params["sync_load_max_s"] == float("inf")
    assert replace(sync, name=ps.name, role=ps.role, peer=ps.peer, source=ps.source,
                   tiering_params=ps.tiering_params) == ps
    c = get_stack("continuum")
    assert c.retention == "continuum" and c.admission == "program-fcfs"
    for n in stack_names():
        st = get_stack(n)
        assert st.source and st.peer
        if st.role == "peer":
            assert st.policy == "lru"   # every peer keeps vLLM's GPU eviction order


def test_anchorage_ablations_change_exactly_one_component():
    full = get_stack("anchorage")
    assert (full.router, full.policy, full.admission, full.tiering) == (
        "agent", "hybrid", "prefix-aware", "store-all")
    assert full.admission_kwargs(2.0) == {"ttft_target_s": 2.0}   # the setting's SLO
    assert full.long_prefill_tokens == 2048
    assert full.tiering_params == {"host_scope": "node-lru"}      # the node pool
    # the ablations change one component of the stack without the target, the cap and the
    # node pool
    base = get_stack("anchorage-no-target")
    fields = ("router", "policy", "admission", "tiering", "program_gate", "admission_params",
              "long_prefill_tokens", "tiering_params")
    assert [f for f in fields if getattr(base, f) != getattr(full, f)] == [
        "admission_params", "long_prefill_tokens", "tiering_params"]
    # the variants of the full stack itself
    of_full = {"anchorage-no-prefill-cap": "long_prefill_tokens",
               "anchorage-own-host": "tiering_params",
               "anchorage-node-pooled": "tiering_params",
               "anchorage-node-share": "tiering_params"}
    for n, f in of_full.items():
        assert [g for g in fields if getattr(get_stack(n), g) != getattr(full, g)] == [f], n
    assert get_stack("anchorage-own-host").tiering_params == {}   # each replica its own
    assert get_stack("anchorage-node-pooled").tiering_params == {"host_scope": "pooled"}
    assert get_stack("anchorage-node-share").tiering_params == {"host_scope": "node"}
    for n in stack_names("ablation"):
        if n == base.name or n in of_full or not n.startswith("anchorage-"):
            continue
        a = get_stack(n)
        changed = [f for f in fields if getattr(a, f) != getattr(base, f)]
        assert len(changed) == 1, (n, changed)
    for n in ("limit-host", "limit-tiers"):  # the full stack: target, cap, node pool included
        assert get_stack(n).admission_params == full.admission_params
        assert get_stack(n).long_prefill_tokens == full.long_prefill_tokens
        assert get_stack(n).tiering_params == full.tiering_params
    # every peer has the cap (a vLLM flag any peer sets); the controls are the peers
    # without it, never a peer row
    for peer in stack_names("peer"):
        p = get_stack(peer)
        assert p.long_prefill_tokens == full.long_prefill_tokens == 2048, peer
        c = get_stack(f"{peer}-no-prefill-cap")
        assert c.role == "ablation" and c.long_prefill_tokens == 0
        assert replace(c, name=p.name, role=p.role, peer=p.peer,
                       long_prefill_tokens=p.long_prefill_tokens) == p
    with pytest.raises(ValueError, match="long_prefill_tokens"):
        StackSpec(name="x", peer="x", source="x", long_prefill_tokens=-1)
    with pytest.raises(ValueError, match="unknown admission parameter"):
        StackSpec(name="x", peer="x", source="x", admission="prefix-aware",
                  admission_params={"target": "$slo"})
    with pytest.raises(ValueError, match="need prefix-aware"):
        StackSpec(name="x", peer="x", source="x", admission_params={"ttft_target_s": 1.0})
    assert get_stack("limit-hbm").limit == "infinite-device"
    assert get_stack("limit-host").limit == "infinite-host"


def test_a_spec_rejects_unknown_components_and_names():
    with pytest.raises(ValueError, match="unknown router"):
        StackSpec(name="x", peer="x", source="x", router="nope")
    with pytest.raises(ValueError, match="unknown tiering"):
        StackSpec(name="x", peer="x", source="x", tiering="nope")
    with pytest.raises(TypeError):
        StackSpec(name="x", peer="x", source="x", colour="red")
    with pytest.raises(ValueError, match="unknown stack"):
        get_stack("nope")


def test_memory_hierarchy_shares_and_links():
    assert PCIE_GEN5_X16_GBS == pytest.approx(63.015, rel=1e-3)
    h = MemoryHierarchy()
    p8 = get_profile("h200-llama3-8b")
    p32 = get_profile("h200x2-qwen2.5-32b-tp2")
    assert h.host_config(p8).capacity_bytes == 256e9
    assert h.host_config(p32).capacity_bytes == 512e9       # two GPUs' shares
    assert h.host_config(p8).d2h_bytes_s == 50e9
    assert h.host_config(p32).h2d_bytes_s == 100e9          # a shard over each GPU's link
    shared = MemoryHierarchy(gpus_per_link=2)
    assert shared.replicas_per_link(p8) == 2 and shared.link_bytes_s(p8) == 50e9
    assert shared.replicas_per_link(p32) == 1 and shared.link_bytes_s(p32) == 50e9
    assert MemoryHierarchy(infinite_host=True).host_config(p8).capacity_bytes > 1e17
    with pytest.raises(ValueError):
        MemoryHierarchy(gpus_per_link=3)


def test_slo_capacity_interpolates_where_p90_crosses_the_slo():
    pts = [(1, 0.5, 1.0), (2, 1.5, 2.0), (4, 3.5, 3.0)]
    assert slo_capacity(pts, 2.0) == pytest.approx(2.0 + 0.25 * 1.0)
    assert slo_capacity(pts, 10.0) == 3.0
    assert slo_capacity([(1, 2.5, 1.0)], 2.0) == 0.0


def test_slo_capacity_is_the_best_load_within_the_slo_not_only_the_crossing():
    # goodput falls past its best load while the p90 is still within the SLO: the best
    # operating point counts, and nothing after the first crossing does
    pts = [(1, 0.2, 2.0), (2, 0.4, 5.0), (3, 1.5, 4.0), (4, 3.5, 1.0), (5, 0.5, 9.0)]
    assert slo_capacity(pts, 2.0) == 5.0
    rising = [(1, 0.2, 2.0), (2, 1.0, 3.0), (3, 3.0, 5.0)]
    assert slo_capacity(rising, 2.0) == pytest.approx(4.0)


def test_summary_ratios_to_the_best_peer_and_the_limit():
    rows = []
    for stack, k in (("stock", 1.0), ("smg", 2.0), ("anchorage", 3.0), ("limit-hbm", 4.0)):
        for load in (1, 2):
            rows.append({"workload": "w", "stack": stack, "load": load, "seed": 1,
                         "ttft_p90_s": 0.1 * load, "turns_per_s_per_gpu": k * load,
                         "goodput_per_gpu": k * load})
    roles = {"stock": "peer", "smg": "peer", "anchorage": "anchorage", "limit-hbm": "limit"}
    s = summarize(rows, 2.0, roles)["w"]
    assert s["anchorage"]["best_peer"] == "smg"
    assert s["anchorage"]["vs_best_peer"] == pytest.approx(1.5)
    assert s["anchorage"]["vs_limit"] == pytest.approx(0.75)
    assert s["smg"]["knee"]["load"] == 2


def test_coarsen_keeps_the_last_id_of_each_group():
    assert coarsen([1, 2, 3, 4, 5, 6, 7], 4) == [4, 7]
    assert coarsen([1, 2], 1) == [1, 2]


def test_paper_ratio_text_reads_each_metric_in_its_own_direction():
    from bench.fleet_papers import markdown, ratio_text
    assert ratio_text(0.6, 0.5, "points") == "+10.0 points"
    assert ratio_text(3.0, 2.0, "higher") == "1.50x"
    assert ratio_text(1.0, 2.0, "lower") == "-50.0%"
    assert ratio_text(None, 2.0, "higher") == "-" and ratio_text(1.0, 0.0, "lower") == "-"
    md = markdown({"cachewise": {40: {"cachewise-paper": {"token_goodput": 3.0},
                                      "vllm-prefix-aware": {"token_goodput": 2.0}}}})
    assert "| cachewise | cachewise-paper vs vllm-prefix-aware | token_goodput | 40 | 1.50x |" in md


def test_headline_names_the_best_peer_and_calls_an_unreachable_target():
    from bench.fleet_report import headline
    rows = []
    for stack, k in (("smg", 2.0), ("llm-d", 2.5), ("anchorage", 2.6), ("limit-hbm", 3.0)):
        for load in (1, 2):
            rows.append({"workload": "w", "stack": stack, "load": load, "seed": 1,
                         "ttft_p90_s": 0.1 * load, "turns_per_s_per_gpu": k * load,
                         "goodput_per_gpu": k * load})
    roles = {"smg": "peer", "llm-d": "peer", "anchorage": "anchorage", "limit-hbm": "limit"}
    line = headline(summarize(rows, 2.0, roles)).splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["w", "llm-d", ">=5"]      # never past the SLO: open-ended
    assert cells[4] == "1.040"
    assert cells[6] == ">=1.200"       # the limit's throughput still grows: open-ended
    assert cells[7] == "1.3x: missed"   # the default target of a workload not in TARGETS
    assert cells[8] == cells[9] == "-"  # no infinite-host or free-reload limit row here
    assert "1.02x: met" in headline(summarize(rows, 2.0, roles), target=1.02)
    gen = [{**r, "workload": "gen"} for r in rows]      # issue 18's 1.2x on that workload
    assert "1.2x: missed" in headline(summarize(gen, 2.0, roles))
    for load in (1, 2):
        rows.append({"workload": "w", "stack": "limit-tiers", "load": load, "seed": 1,
                     "ttft_p90_s": 1.5 * load, "turns_per_s_per_gpu": 2.75 * load,
                     "goodput_per_gpu": 2.75 * load})
        rows.append({"workload": "w", "stack": "limit-host", "load": load, "seed": 1,
                     "ttft_p90_s": 0.5 * load, "turns_per_s_per_gpu": 2.6 * load,
                     "goodput_per_gpu": 2.6 * load})
    roles["limit-tiers"] = roles["limit-host"] = "limit"
    line = headline(summarize(rows, 2.0, roles)).splitlines()[-1]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[8] == ">=5.2 (>=1.04x)"   # the infinite-host limit: within the SLO throughout
    assert cells[9] == "3.667 (0.73x)"    # crosses the SLO between loads 1 and 2


def test_a_stack_within_the_slo_at_every_load_is_open_ended():
    rows = [{"workload": "w", "stack": "smg", "load": ld, "seed": 1, "ttft_p90_s": p,
             "turns_per_s_per_gpu": ld, "goodput_per_gpu": ld}
            for ld, p in ((1, 0.5), (2, 1.0))]
    rows += [{"workload": "w", "stack": "stock", "load": ld, "seed": 1, "ttft_p90_s": p,
              "turns_per_s_per_gpu": ld, "goodput_per_gpu": ld}
             for ld, p in ((1, 0.5), (2, 3.0))]
    s = summarize(rows, 2.0, {"smg": "peer", "stock": "peer"})["w"]
    assert s["smg"]["open_ended"] and not s["stock"]["open_ended"]


def test_a_saturated_limit_makes_a_target_above_it_unreachable():
    from bench.fleet_report import headline
    rows = []
    for stack, tps in (("smg", (2.0, 2.5, 2.5)), ("anchorage", (2.0, 2.6, 2.6)),
                       ("limit-hbm", (2.0, 2.9, 3.0))):
        for load, t in zip((1, 2, 3), tps):
            rows.append({"workload": "w", "stack": stack, "load": load, "seed": 1,
                         "ttft_p90_s": 0.5 * load, "turns_per_s_per_gpu": t,
                         "goodput_per_gpu": t})
    roles = {"smg": "peer", "anchorage": "anchorage", "limit-hbm": "limit"}
    cells = [c.strip() for c in headline(summarize(rows, 2.0, roles)).splitlines()[-1]
             .strip("|").split("|")]
    assert cells[6] == "1.200" and cells[7] == "1.3x: unreachable (bound below target)"


def test_the_tiers_limit_reloads_for_free_and_bounds_the_real_link():
    from anchorage.fleet.run import Setting, run_stack
    from bench import fleet_workloads

    assert get_stack("limit-tiers").limit == "free-tiers"
    free = MemoryHierarchy(free_reload=True).host_config(get_profile("h200-llama3-8b"))
    assert free.capacity_bytes > 1e17 and free.h2d_bytes_s > 1e17 and free.latency_s == 0
    recs, ctxs, bs = fleet_workloads.load("swe", 24, 1)
    # a small HBM and a slow link: reloads are many and, over the real link, slow
    prof = get_profile("h200-llama3-8b").with_(block_size=bs, capacity_blocks_override=1500)
    out = {}
    for name in ("limit-host", "limit-tiers"):
        st = Setting(prof, 2, slots=12, time_scale=1e-3,
                     hierarchy=MemoryHierarchy(link_gbs_per_gpu=0.5))
        out[name] = run_stack(get_stack(name), recs, ctxs, st)
    slow, free_run = out["limit-host"], out["limit-tiers"]
    assert slow["reload_bytes"] > 0 and free_run["reload_bytes"] > 0
    assert free_run["ttft_mean_s"] < slow["ttft_mean_s"]
