import sys, dataclasses
from bench.fleet_papers import workload, ARMS, one_run
from anchorage.fleet.run import run_stack
from anchorage.policies.group.config import Signals
load=int(sys.argv[1]) if len(sys.argv)>1 else 40
seed=int(sys.argv[2]) if len(sys.argv)>2 else 1
recs, ctxs, prof, st = workload({"paper":"cachewise-swe","seed":seed,"load":load})
import os
base = dataclasses.replace(ARMS["cachewise-swe"]["hybrid-prefix-aware"], admission=os.environ.get("ADM","prefix-aware"))
def run(name, policy, params=None):
    spec = dataclasses.replace(base, policy=policy)
    recs2, ctxs2, prof2, st2 = workload({"paper":"cachewise-swe","seed":seed,"load":load})
    r = run_stack(spec, recs2, ctxs2, st2, policy_params=params)
    print(f"{name:22s} hit={r['gpu_hit_rate']:.4f} ttft={r['ttft_mean_s']:.3f} ev={r['evictions']} cpu={r['cpu_s']:.1f}", flush=True)
run("lru","lru")
run("hybrid","hybrid")
for f in [f.name for f in dataclasses.fields(Signals)]:
    run(f"hybrid -{f}", "hybrid", {"signals": Signals(**{f: False})})
run("hybrid none", "hybrid", {"signals": Signals(**{f.name: False for f in dataclasses.fields(Signals)})})
from anchorage.policies.group.policy import GroupEvictionPolicy
orig = GroupEvictionPolicy.on_queued
GroupEvictionPolicy.on_queued = lambda self, ctx: None
run("hybrid noqueue-learn", "hybrid")
run("none noqueue-learn", "hybrid", {"signals": Signals(**{f.name: False for f in dataclasses.fields(Signals)})})
GroupEvictionPolicy.on_queued = lambda self, ctx: self.on_request(ctx)
run("hybrid nohold", "hybrid")
run("none nohold", "hybrid", {"signals": Signals(**{f.name: False for f in dataclasses.fields(Signals)})})
GroupEvictionPolicy.on_queued = orig
