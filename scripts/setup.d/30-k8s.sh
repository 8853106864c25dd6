#!/usr/bin/env bash
# A real Kubernetes 1.20 control plane for the operator's integration tests: etcd-server
# (apt) and kube-apiserver + kube-controller-manager built from Debian's source package by
# scripts/k8s/build.sh, cached in ~/.cache/anchorage/k8s-1.20 (rebuilt only when missing).
set -euo pipefail
bash "$(dirname "$0")/../k8s/build.sh" >/dev/null
