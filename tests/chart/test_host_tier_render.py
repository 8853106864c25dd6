"""The chart's host tier (values ``hostTier``): the ``--kv-transfer-config`` it renders is
what ``anchorage.node_agent.offload.config.transfer_config`` builds (one source) and what
the connector accepts; vLLM's own backend and LMCache render as they ship; bad values
stop the render with a message naming the field."""

from __future__ import annotations

import json

import pytest

from anchorage.node_agent.offload.config import OffloadConfig, transfer_config
from tests.chart.conftest import CHART, NAMESPACE, RELEASE, model, objects, one, render, with_images

GIB = 1 << 30


def _vllm(values: dict) -> dict:
    dep = one(objects(render(values)), "Deployment", "-m")
    return next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")


def _ktc(c: dict) -> dict | None:
    a = c["args"]
    assert a.count("--kv-transfer-config") <= 1
    return json.loads(a[a.index("--kv-transfer-config") + 1]) if "--kv-transfer-config" in a else None


def test_the_anchorage_host_tier_renders_the_connector_config():
    c = _vllm({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 256,
                                                "transferTimeoutSeconds": 2})]})
    got = _ktc(c)
    want = transfer_config(256 * GIB, blocks_per_chunk=1,
                           anchorage={"link_gbs": 25, "reload_ahead": True,
                                      "transfer_timeout_s": 2, "sync_load_max_ms": 0})
    assert got == want
    cfg = OffloadConfig.from_extra_config(got["kv_connector_extra_config"])
    assert cfg.cpu_bytes_to_use == 256 * GIB and cfg.transfer_timeout_s == 2.0
    assert cfg.sync_load_max_ms == 0.0


@pytest.mark.parametrize("ms", [2, 0.5])
def test_sync_load_max_ms_reaches_the_connector(ms):
    """hostTier.syncLoadMaxMs is the connector's sync_load_max_ms (default 0: vLLM's
    asynchronous loads; tests/node_agent/test_host_tier_engine.py runs both in the engine)."""
    c = _vllm({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 8,
                                                "syncLoadMaxMs": ms})]})
    cfg = OffloadConfig.from_extra_config(_ktc(c)["kv_connector_extra_config"])
    assert cfg.sync_load_max_ms == ms


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_vllms_own_backend_renders_as_vllm_ships_it(policy):
    c = _vllm({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 64,
                                                "backend": "vllm", "policy": policy})]})
    assert _ktc(c) == transfer_config(64 * GIB, policy=policy, connector="stock",
                                      spec="vllm", blocks_per_chunk=1)


def test_lmcache_renders_its_connector_and_cpu_backend():
    c = _vllm({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 100,
                                                "backend": "lmcache"})]})
    assert _ktc(c) == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["LMCACHE_LOCAL_CPU"] == "True" and env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "100"


def test_the_host_tier_replaces_temporal_tierings_connector_and_is_off_by_default():
    c = _vllm({"models": [model("m", tiering="temporal", hostOffload={"memoryGiB": 8},
                                hostTier={"enabled": True, "memoryGiB": 16})]})
    assert _ktc(c)["kv_connector"] == "AnchorageOffloadingConnector"
    assert _ktc(_vllm({"models": [model("m")]})) is None


@pytest.mark.parametrize("tier,message", [
    ({"enabled": True}, "set hostTier.memoryGiB"),
    ({"enabled": True, "memoryGiB": 8, "backend": "vllm", "policy": "anchorage"},
     "hostTier.policy anchorage needs hostTier.backend anchorage"),
])
def test_bad_host_tier_values_name_the_field(tier, message):
    from helm_python import Chart, HelmRenderError

    chart = Chart.load(str(CHART))
    with pytest.raises(HelmRenderError) as exc:
        chart.render(with_images({"models": [model("a", hostTier=tier)]}), name=RELEASE,
                     namespace=NAMESPACE)
    assert message in str(exc.value)


def test_the_schema_rejects_an_unknown_backend():
    from helm_python import Chart

    chart = Chart.load(str(CHART))
    with pytest.raises(Exception) as exc:
        chart.render(with_images({"models": [model("a", hostTier={"enabled": True, "memoryGiB": 8,
                                                        "backend": "disk"})]}),
                     name=RELEASE, namespace=NAMESPACE)
    assert "backend" in str(exc.value)


def _pod(values: dict) -> dict:
    return one(objects(render(values)), "Deployment", "-m")["spec"]["template"]["spec"]


def test_the_node_pool_renders_its_directory_mount_and_connector_key():
    """hostTier.nodePool: the connector's node_pool_dir (one directory per model), which the
    spec reads (OffloadConfig), on a hostPath every engine pod of the model on the node
    mounts; off: none of it."""
    tier = {"enabled": True, "memoryGiB": 64,
            "nodePool": {"enabled": True, "hostPath": "/dev/shm/pool-x"}}
    pod = _pod({"models": [model("m", hostTier=tier)]})
    c = next(c for c in pod["containers"] if c["name"] == "vllm")
    ec = _ktc(c)["kv_connector_extra_config"]
    assert ec["anchorage"]["node_pool_dir"] == "/run/anchorage-pool/m"
    assert OffloadConfig.from_extra_config(ec).node_pool_dir == "/run/anchorage-pool/m"
    # growth: the default 4, or the value set (the engine's slots: test_host_tier_engine)
    assert OffloadConfig.from_extra_config(ec).node_pool_growth == 4
    grown = _pod({"models": [model("m", hostTier={**tier, "nodePool": {
        **tier["nodePool"], "growth": 2}})]})
    gc = next(c for c in grown["containers"] if c["name"] == "vllm")
    assert OffloadConfig.from_extra_config(
        _ktc(gc)["kv_connector_extra_config"]).node_pool_growth == 2
    assert {"name": "anchorage-pool", "mountPath": "/run/anchorage-pool"} in c["volumeMounts"]
    vol = next(v for v in pod["volumes"] if v["name"] == "anchorage-pool")
    assert vol["hostPath"] == {"path": "/dev/shm/pool-x", "type": "DirectoryOrCreate"}
    # the node agent never mounts it
    agent = next(c for c in pod["containers"] if c["name"] == "node-agent")
    assert all(m["name"] != "anchorage-pool" for m in agent["volumeMounts"])
    # kubelet creates the hostPath as root: an init container gives the model's directory
    # to the engines' user (the pod's runAsUser / runAsGroup), root with CHOWN alone
    (init,) = pod["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {"POOL_DIR": "/run/anchorage-pool/m", "POOL_UID": "1000",
                   "POOL_GID": "1000"}
    sc = init["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsUser"] == 1000
    pod = _pod({"models": [model("m", hostTier=tier, podSecurityContext={"runAsUser": 2000})]})
    env = {e["name"]: e["value"] for e in pod["initContainers"][0]["env"]}
    assert env["POOL_UID"] == "2000"
    for off in ({"enabled": True, "memoryGiB": 64},
                {"enabled": False, "memoryGiB": 64, "nodePool": {"enabled": True}}):
        pod = _pod({"models": [model("m", hostTier=off)]})
        assert all(v["name"] != "anchorage-pool" for v in pod["volumes"])
        assert "initContainers" not in pod
        c = next(c for c in pod["containers"] if c["name"] == "vllm")
        ktc = _ktc(c)
        assert ktc is None or "node_pool_dir" not in ktc["kv_connector_extra_config"].get(
            "anchorage", {})


def test_the_node_pool_needs_anchorages_backend_and_an_absolute_path():
    with pytest.raises(Exception, match="nodePool needs hostTier.backend anchorage"):
        render({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 8,
                                                "backend": "vllm", "policy": "lru",
                                                "nodePool": {"enabled": True}})]})
    for bad in ({"hostPath": "relative/dir"}, {"enabeld": True}, {"growth": 0}):
        with pytest.raises(Exception, match="nodePool|hostPath|enabeld|growth"):
            render({"models": [model("m", hostTier={"enabled": True, "memoryGiB": 8,
                                                    "nodePool": bad})]})
