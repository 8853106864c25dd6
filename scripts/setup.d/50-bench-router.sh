#!/usr/bin/env bash
# What bench/bench_router_cost.py compares against: wrk (the load generator, Debian) and
# the SGLang model gateway `smg` (PyPI, a Rust binary in the wheel) in its own venv
# (.venv-smg), so its dependencies never mix with the project's. Benchmarks only.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v wrk >/dev/null 2>&1; then
  printf '\033[1m[setup]\033[0m installing wrk (apt)\n'
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends wrk
fi
if [ ! -x .venv-smg/bin/smg ]; then
  printf '\033[1m[setup]\033[0m installing smg 1.13.0 into .venv-smg (pip)\n'
  python3 -m venv .venv-smg
  .venv-smg/bin/pip install -q "smg==1.13.0"
fi
