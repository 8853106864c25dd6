#!/usr/bin/env bash
# The real Prometheus server (Debian package, 2.42) for operator and dashboard tests.
set -euo pipefail
command -v prometheus >/dev/null 2>&1 && exit 0
printf '\033[1m[setup]\033[0m installing prometheus (apt, ~30 s)\n'
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends prometheus
