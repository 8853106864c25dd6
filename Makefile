# Two newcomer commands (see README):
#   make demo   set up and run the main job on embedded defaults
#   make test   set up and pass the tests
PY      ?= python3
VENV    ?= .venv
export ANCHORAGE_VENV := $(abspath $(VENV))

.PHONY: demo policies fleet-quick test test-cluster setup setup-core setup-demo bench clean

# Everything `make test` needs (the dev extra, vLLM's CPU build, Ray, kopf, a Kubernetes
# 1.20 build, Prometheus).
setup:
	@bash scripts/setup.sh

setup-core:
	@ANCHORAGE_SETUP_PROFILE=core bash scripts/setup.sh

# Only what the demo needs: the core, vLLM's CPU build, Ray Serve, Prometheus.
setup-demo:
	@ANCHORAGE_SETUP_PROFILE=demo bash scripts/setup.sh

# The main job: the whole stack on this machine (two tiny vLLM CPU engines with node agents,
# the router, Prometheus), stock vLLM + round-robin vs Anchorage hybrid + agent routing on
# the same multi-agent workload; report in out/demo/.
demo: setup-demo
	@$(VENV)/bin/anchorage demo

# The eviction-policy comparison alone (simulator only; needs just the core install).
policies: setup-core
	@$(VENV)/bin/anchorage bench --workloads generated:pipeline,generated:random --no-half-lru \
	    --policies lru,arc,cachescout,cachewise,hybrid,belady --capacities 0.02,0.05,0.1

# The headline benchmark's small matrix (simulator only): every peer stack, Anchorage and
# the infinite-HBM limit on the four workloads, one seed, three loads; about 7 minutes on
# two cores. Tables and plots in out/fleet-quick/ (BENCHMARKS.md has the full matrix).
fleet-quick: setup-core
	@$(VENV)/bin/python -m bench.bench_fleet --quick --jobs 2 --out out/fleet-quick/fleet_quick.json

test: setup
	@bash scripts/run_tests.sh

# Only the chart on a real single-node Kubernetes (tests/cluster/; `make test` runs it too,
# ANCHORAGE_CLUSTER=0 leaves it out of both the setup and the suite).
test-cluster:
	@ANCHORAGE_CLUSTER=1 bash scripts/setup.sh
	@ANCHORAGE_CLUSTER=1 bash scripts/run_tests.sh tests/cluster

# The headline benchmarks of bench/ with their defaults (long: about an hour here); results
# in bench/results/. The others (router placement sweeps and bound, Ray Serve overhead,
# oracle ladder, vLLM patch cost) take their own arguments: see BENCHMARKS.md.
BENCHES := bench_demo bench_engine bench_foundation bench_node_state bench_policies \
           bench_pool bench_router bench_tiering bench_timed
bench: setup
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(VENV)/bin/python -m bench.$$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
