#!/usr/bin/env bash
# Build the anchorage images (anchorage: operator + sidecar; anchorage-router) for real
# without a Docker daemon or a container registry, then check them from the inside. For machines that reach only Debian and PyPI (like CI here):
#
#   1. the anchorage wheel, and every dependency's wheel downloaded by the host's pip, into
#      images/dist/ (the Dockerfile's bind mount; the build runs with PIP_NO_INDEX=1);
#   2. a stand-in for the python:3.11-slim-bookworm base: debootstrap bookworm (its python3
#      is 3.11) with python3-pip, tagged docker.io/library/python:3.11-slim-bookworm in
#      buildah's local storage (cached under $ANCHORAGE_IMAGES_CACHE);
#   3. `buildah build --isolation chroot --pull=never` of images/anchorage/Dockerfile and
#      images/anchorage-router/Dockerfile, the Dockerfiles themselves unchanged;
#   4. inside anchorage: runs as 1000:1000, `anchorage --help`, the operator (kopf) and the
#      node agent import, the vLLM plugin entry point resolves, Ray is absent, and a bad
#      operator option fails with a one-line error; inside anchorage-router: 1000:1000, the
#      router app and Ray import, wget (KubeRay's probes).
#
# vllm-anchorage is not built here: its base (vllm/vllm-openai) only comes from a registry.
# Needs root, apt (buildah, debootstrap) and about 3 GB in /var/lib/containers; about 8 min
# cold, 5 min with the base cached. Not part of `make test`.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
CACHE=${ANCHORAGE_IMAGES_CACHE:-$HOME/.cache/anchorage/images}
ROOTFS=$CACHE/rootfs-bookworm-python3
BASE=docker.io/library/python:3.11-slim-bookworm
B=(buildah --storage-driver vfs)
say() { printf '\n== %s\n' "$*"; }

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing buildah and debootstrap (apt)"
  apt-get install -y --no-install-recommends buildah debootstrap >/dev/null
fi

cd "$REPO"
mapfile -t REFS < <("$PY" scripts/images/build.py --print --only anchorage)
REF=${REFS[0]}
VERSION=${REF##*:}
mapfile -t RREFS < <("$PY" scripts/images/build.py --print --only anchorage-router)
RREF=${RREFS[0]}

say "wheel and wheelhouse (images/dist/)"
"$PY" scripts/images/build.py --wheel-only
"$PY" -m pip download --quiet --disable-pip-version-check -d images/dist \
  "images/dist/anchorage-$VERSION-py3-none-any.whl[operator,plugin,router]"

if ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    say "debootstrap bookworm + python3 (first time: ~3 min)"
    rm -rf "$ROOTFS.tmp"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
      bookworm "$ROOTFS.tmp" http://deb.debian.org/debian >/dev/null
    # behave like the python image: pip may install system-wide, `python` exists
    rm -f "$ROOTFS.tmp"/usr/lib/python3.*/EXTERNALLY-MANAGED
    ln -sf python3 "$ROOTFS.tmp/usr/bin/python"
    rm -rf "$ROOTFS.tmp"/var/cache/apt/archives/*.deb "$ROOTFS.tmp"/var/lib/apt/lists/*
    mv "$ROOTFS.tmp" "$ROOTFS"
  fi
  say "importing the base as $BASE (local storage only)"
  ctr=$("${B[@]}" from scratch)
  "${B[@]}" copy "$ctr" "$ROOTFS" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd python3 "$ctr"
  "${B[@]}" commit -q "$ctr" "$BASE" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
fi

build() {  # image ref, Dockerfile
  say "buildah build $1"
  local start; start=$(date +%s)
  "${B[@]}" build --pull=never --isolation chroot --build-arg "ANCHORAGE_VERSION=$VERSION" \
    --build-arg PIP_NO_INDEX=1 -f "$2" -t "$1" images
  echo "built in $(( $(date +%s) - start )) s"
}
build "$REF" images/anchorage/Dockerfile
build "$RREF" images/anchorage-router/Dockerfile

CTRS=()
trap 'for c in "${CTRS[@]}"; do "${B[@]}" rm "$c" >/dev/null 2>&1 || true; done' EXIT

say "checks inside $REF"
ctr=$("${B[@]}" from --pull=never "$REF"); CTRS+=("$ctr")
run() { "${B[@]}" run --isolation chroot "$ctr" -- "$@"; }
[ "$(run id -u):$(run id -g)" = "1000:1000" ] || { echo "FAIL: not running as 1000:1000"; exit 1; }
run anchorage --help >/dev/null
run python -c "
import importlib.metadata as m, importlib.util
eps = [e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'anchorage']
assert eps and eps[0].value == 'anchorage.node_agent.plugin:register', eps
eps[0].load()
import anchorage.operator.handlers, anchorage.node_agent.sidecar, kopf
assert importlib.util.find_spec('ray') is None, 'ray is installed in the sidecar image'
assert m.version('anchorage') == '$VERSION', m.version('anchorage')
print('operator and node agent import; plugin entry point resolves; no ray')
"
if out=$(run anchorage operator --peering-lifetime-s 1 2>&1); then
  echo "FAIL: a bad operator option was accepted"; exit 1
fi
case "$out" in *Traceback*) echo "FAIL: traceback: $out"; exit 1;; esac
echo "bad option -> $out"
"${B[@]}" inspect --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$REF"; echo

say "checks inside $RREF"
ctr=$("${B[@]}" from --pull=never "$RREF"); CTRS+=("$ctr")
[ "$(run id -u):$(run id -g)" = "1000:1000" ] || { echo "FAIL: not running as 1000:1000"; exit 1; }
run python -c "
import anchorage.router.app, ray
print('router imports; ray', ray.__version__)
"
run wget --version >/dev/null
"${B[@]}" images "$REF"
"${B[@]}" images "$RREF"
say "OK: $REF and $RREF built with buildah and checked"
