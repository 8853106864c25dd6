#!/usr/bin/env bash
# A real single-node Kubernetes cluster for the chart's end-to-end test
# (tests/cluster/), only with ANCHORAGE_CLUSTER=1 (`make test-cluster`): the node binaries
# (kubelet, kube-scheduler, kube-proxy, built with the control plane by scripts/k8s/build.sh),
# Debian's docker.io (dockershim's runtime; no daemon is started on the host), debootstrap
# (the images' base root file system) and the images' layers (scripts/cluster/images.py,
# cached in ~/.cache/anchorage). Off by default: cold, this setup plus the test take longer
# than CI's budget leaves next to the rest of the suite (docs/testing: measured times).
set -euo pipefail
[ "${ANCHORAGE_CLUSTER:-0}" = 1 ] || exit 0
bash "$(dirname "$0")/../k8s/build.sh" >/dev/null
bash "$(dirname "$0")/../cluster/deps.sh"
"$VENV/bin/python" "$(dirname "$0")/../cluster/images.py" prepare
