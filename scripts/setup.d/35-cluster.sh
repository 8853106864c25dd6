#!/usr/bin/env bash
# A real single-node Kubernetes cluster for the chart's end-to-end test (tests/cluster/,
# part of `make test` and CI): the node binaries (kubelet, kube-scheduler, kube-proxy, built
# with the control plane by scripts/k8s/build.sh), Debian's docker.io (dockershim's runtime;
# no daemon is started on the host), debootstrap (the images' base root file system) and
# the images' layers (scripts/cluster/images.py, cached in ~/.cache/anchorage). Cold on a
# fresh 2-core machine: 205 s (docs/chart.md, "The chart on a real single-node cluster").
# ANCHORAGE_CLUSTER=0 leaves it out (a quick local setup; the cluster test then skips).
set -euo pipefail
[ "${ANCHORAGE_CLUSTER:-1}" != 0 ] || exit 0
bash "$(dirname "$0")/../k8s/build.sh" >/dev/null
bash "$(dirname "$0")/../cluster/deps.sh"
"$VENV/bin/python" "$(dirname "$0")/../cluster/images.py" prepare
