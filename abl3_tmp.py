import sys, dataclasses
from bench.fleet_papers import workload, ARMS
from anchorage.fleet.run import run_stack
from anchorage.policies.group.policy import GroupEvictionPolicy
load=float(sys.argv[1]); cap=int(sys.argv[2]) if len(sys.argv)>2 else 16384
def run(name, pol):
    recs, ctxs, prof, st = workload({"paper":"cachescout","seed":1,"load":load})
    prof=prof.with_(capacity_blocks_override=cap)
    st=dataclasses.replace(st, profile=prof)
    spec=dataclasses.replace(ARMS["cachescout"]["vllm"], policy=pol)
    r=run_stack(spec, recs, ctxs, st)
    print(f"{name:18s} hit={r['gpu_hit_rate']:.4f} ttft={r['ttft_mean_s']:.3f} pre={r['preemptions']} cpu={r['cpu_s']:.1f}", flush=True)
print(ARMS["cachescout"]["vllm"].admission)
run("lru","lru"); run("hybrid","hybrid")
orig=GroupEvictionPolicy.on_queued
GroupEvictionPolicy.on_queued=lambda self,ctx: None
run("hybrid noqueued","hybrid")
GroupEvictionPolicy.on_queued=lambda self,ctx: self.on_request(ctx)
run("hybrid nohold","hybrid")
