#!/usr/bin/env bash
# System packages of the single-node cluster, installed without starting any daemon on the
# host: Debian's docker.io (dockerd 20.10, containerd, runc; kubelet 1.20's dockershim
# talks to it), iptables (kube-proxy), debootstrap and gcc (the images' base root file
# system and the static pause binary). Idempotent.
set -euo pipefail
pkgs=(docker.io iptables debootstrap gcc libc6-dev conntrack)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ "${#missing[@]}" -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
printf '\033[1m[setup]\033[0m installing %s (apt; no daemon is started)\n' "${missing[*]}"
# policy-rc.d exit 101: maintainer scripts may not start services (docker.io's would start
# dockerd on the host).
added_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod 0755 /usr/sbin/policy-rc.d
  added_policy=1
fi
trap 'if [ "$added_policy" = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi' EXIT
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
