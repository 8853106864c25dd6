# Two newcomer commands (see README):
#   make demo   set up and run the main job on embedded defaults
#   make test   set up and pass the tests
PY      ?= python3
VENV    ?= .venv
export ANCHORAGE_VENV := $(abspath $(VENV))

.PHONY: demo test setup setup-core bench lint clean

setup:
	@bash scripts/setup.sh

setup-core:
	@ANCHORAGE_SETUP_CORE_ONLY=1 bash scripts/setup.sh

# Until the full stack (`anchorage up`) lands, the main job is the policy comparison on
# generated multi-agent workloads.
demo: setup-core
	@$(VENV)/bin/anchorage bench --workloads generated:pipeline,generated:hierarchical,generated:random

test: setup
	@bash scripts/run_tests.sh

bench: setup
	@$(VENV)/bin/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
