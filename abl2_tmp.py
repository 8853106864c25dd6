import sys, dataclasses, os
from bench.fleet_papers import workload, ARMS
from anchorage.fleet.run import run_stack
from anchorage.policies.group.config import Signals
NONE = Signals(**{f.name: False for f in dataclasses.fields(Signals)})
for adm in ("prefix-aware", "fcfs"):
  for load in (30, 40, 50):
    out = []
    for seed in (1, 2, 3):
        row = []
        for name, pol, params in (("lru","lru",None),("hybrid","hybrid",None),("none","hybrid",{"signals": NONE})):
            spec = dataclasses.replace(ARMS["cachewise-swe"]["hybrid-prefix-aware"], policy=pol, admission=adm)
            recs, ctxs, prof, st = workload({"paper":"cachewise-swe","seed":seed,"load":load})
            r = run_stack(spec, recs, ctxs, st, policy_params=params)
            row.append(r['gpu_hit_rate'])
        out.append(row)
    m = [sum(x)/3 for x in zip(*out)]
    print(adm, load, "lru=%.4f hybrid=%.4f none=%.4f" % tuple(m), " per seed hybrid-lru:", " ".join("%+.1f" % (100*(r[1]-r[0])) for r in out), flush=True)
