#!/usr/bin/env bash
# System packages the tests need (Debian). Idempotent; skipped when all are present.
set -euo pipefail
pkgs=(make xz-utils iproute2 util-linux)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}";
  else echo "missing system packages: ${missing[*]} (run as root or install them)" >&2; fi
fi
