#!/usr/bin/env bash
# A real single-node Kubernetes cluster for the chart's end-to-end test
# (tests/cluster/): the node binaries (kubelet, kube-scheduler, kube-proxy, built with the
# control plane by scripts/k8s/build.sh), Debian's docker.io (dockershim's runtime; no
# daemon is started on the host), debootstrap (the images' base root file system) and the
# images' root file systems (scripts/cluster/images.py, cached in ~/.cache/anchorage).
set -euo pipefail
bash "$(dirname "$0")/../cluster/deps.sh"
"$VENV/bin/python" "$(dirname "$0")/../cluster/images.py" prepare
