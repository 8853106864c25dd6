#!/usr/bin/env bash
# Idempotent environment setup: a project virtualenv with Anchorage and what its tests need.
# Each step is skipped when already done; steps of other components live in scripts/setup.d/
# (run in name order, each idempotent). ANCHORAGE_SETUP_CORE_ONLY=1 stops after the core.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ANCHORAGE_VENV:-$PWD/.venv}"
PY="${PYTHON:-python3}"
stamp_dir="$VENV/.anchorage-setup"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
mkdir -p "$stamp_dir"

# Re-install the project when its metadata changes (editable: code changes need nothing).
meta_sum=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
if [ ! -f "$stamp_dir/core-$meta_sum" ]; then
  say "installing anchorage (core + dev extras)"
  "$VENV/bin/pip" install --progress-bar on -e '.[dev]'
  rm -f "$stamp_dir"/core-*; touch "$stamp_dir/core-$meta_sum"
fi

[ "${ANCHORAGE_SETUP_CORE_ONLY:-0}" = "1" ] && exit 0

for step in scripts/setup.d/*.sh; do
  [ -e "$step" ] || continue
  VENV="$VENV" STAMP_DIR="$stamp_dir" bash "$step"
done
say "environment ready: $VENV"
