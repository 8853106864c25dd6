import sys, dataclasses
from bench.fleet_papers import workload, ARMS
from anchorage.fleet.run import run_stack
from anchorage.sim.replay import run_policies
cap=int(sys.argv[1])
for load in [float(x) for x in sys.argv[2].split(",")]:
    out=[]
    for pol in ("lru","hybrid"):
        recs, ctxs, prof, st = workload({"paper":"cachescout","seed":1,"load":load})
        prof=prof.with_(capacity_blocks_override=cap)
        st=dataclasses.replace(st, profile=prof)
        spec=dataclasses.replace(ARMS["cachescout"]["vllm"], policy=pol)
        r=run_stack(spec, recs, ctxs, st); out.append(r['gpu_hit_rate']); out.append(r['ttft_mean_s'])
    recs, ctxs, prof, st = workload({"paper":"cachescout","seed":1,"load":load})
    seq=run_policies(ctxs, cap, prof.block_size, ["lru","hybrid"])
    print(load, cap, "timed lru=%.3f (ttft %.2f) hybrid=%.3f (ttft %.2f)" % tuple(out), " seq lru=%.3f hybrid=%.3f" % (seq[0].hit_rate, seq[1].hit_rate), flush=True)
