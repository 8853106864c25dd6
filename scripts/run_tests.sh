#!/usr/bin/env bash
# The test command (README's `make test` and CI run exactly this).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ANCHORAGE_VENV:-$PWD/.venv}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export VLLM_ENABLE_V1_MULTIPROCESSING=0
export PYTHONHASHSEED=0
# Run the slow end-to-end tests too (real vLLM engines behind the router); ANCHORAGE_SLOW=0
# leaves them out of a quick local run.
export ANCHORAGE_SLOW="${ANCHORAGE_SLOW:-1}"
# the slowest tests named at the end (where CI's time goes)
exec "$VENV/bin/python" -m pytest --durations=15 "${@:-tests}"
