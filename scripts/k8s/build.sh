#!/usr/bin/env bash
# Build Kubernetes 1.20 from Debian's `kubernetes` source package (no prebuilt binaries are
# reachable here) and cache them outside the repository: the control plane
# (kube-apiserver, kube-controller-manager) and the node (kubelet, kube-scheduler,
# kube-proxy, for the chart's end-to-end test, unless ANCHORAGE_CLUSTER=0), all in one `make`
# so the packages they share compile once. The kubelet gets the two changes in
# scripts/k8s/patches/ (see ENVIRONMENT.md, "A real single-node cluster with running pods").
# Idempotent: exits at once when every binary asked for is cached and was built with the
# current patches (a stamp holds their hash).
#
#   ANCHORAGE_K8S_CACHE   cache directory (default ~/.cache/anchorage/k8s-1.20)
#   ANCHORAGE_CLUSTER=0   the control plane only (without: the node binaries too; all five
#                         took 310 s cold on 2 cores)
#   prints the cache directory's bin/ path on success as its last line.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${ANCHORAGE_K8S_CACHE:-$HOME/.cache/anchorage/k8s-1.20}"
BIN="$CACHE/bin"
BINARIES=(kube-apiserver kube-controller-manager)
if [ "${ANCHORAGE_CLUSTER:-1}" != 0 ]; then BINARIES+=(kubelet kube-scheduler kube-proxy); fi
say() { printf '\033[1m[k8s]\033[0m %s\n' "$*" >&2; }

# What the cached binaries were built from: the patches' text (the same source tree and
# patches whichever binaries are asked for; the list is the constant it always was).
ALL=(kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy)
KEY=$( { echo "${ALL[*]}"; cat "$HERE"/patches/*.patch; } | sha256sum | cut -c1-16)
cached() {
  [ "$(cat "$BIN/.build-key" 2>/dev/null)" = "$KEY" ] || return 1
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}
if cached; then
  say "cached: $BIN"
  echo "$BIN"
  exit 0
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
need_pkgs=()
for p in golang-go golang-github-modern-go-reflect2-dev rsync etcd-server dpkg-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  say "apt-get install ${need_pkgs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${need_pkgs[@]}"
fi

WORK="$CACHE/build"
mkdir -p "$WORK/apt/lists/partial" "$BIN"
cd "$WORK"

# A private deb-src list so the system's apt configuration is left untouched.
if [ ! -f apt/src.sources ]; then
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > apt/src.sources
fi
APT=(-o Dir::Etc::SourceList="$WORK/apt/src.sources" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$WORK/apt/lists")
if ! ls kubernetes_*.orig.tar.* >/dev/null 2>&1; then
  say "downloading Debian's kubernetes source package"
  apt-get "${APT[@]}" update -qq
  apt-get "${APT[@]}" source --download-only kubernetes
fi

SRC="$WORK/src"
if [ "$(cat "$SRC/.prepared" 2>/dev/null)" != "$KEY" ]; then
  say "unpacking and patching"
  rm -rf "$SRC"; mkdir -p "$SRC"
  tar -xf kubernetes_*.orig.tar.* -C "$SRC" --strip-components=1
  tar -xf kubernetes_*.debian.tar.* -C "$SRC"
  ( cd "$SRC"
    if [ -f debian/patches/series ]; then
      while read -r patch; do
        case "$patch" in ''|'#'*) continue ;; esac
        patch -p1 -s < "debian/patches/${patch%% *}"
      done < debian/patches/series
    fi
    # The vendored reflect2 segfaults under go 1.19 on the first custom-resource create.
    rm -f vendor/github.com/modern-go/reflect2/*.go
    cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go vendor/github.com/modern-go/reflect2/
    # The project's kubelet changes (oom_score_adj clamp, kernel tunables warned about).
    for patch in "$HERE"/patches/*.patch; do
      patch -p1 -s < "$patch"
    done
  )
  echo "$KEY" > "$SRC/.prepared"
fi

say "building ${BINARIES[*]} (~15 min cold on 2 cores, ~3 GB build cache)"
mkdir -p "$WORK/home"
what=""; for b in "${BINARIES[@]}"; do what="$what cmd/$b"; done
( cd "$SRC" && HOME="$WORK/home" CGO_ENABLED=0 nice -n "${ANCHORAGE_BUILD_NICE:-10}" make WHAT="${what# }" )
for b in "${BINARIES[@]}"; do
  f=$(find "$SRC/_output" -type f -name "$b" -perm -u+x | head -1)
  [ -n "$f" ] || { say "build produced no $b"; exit 1; }
  # Copy, then rename: a test starting one of the old binaries never sees a partial file.
  install -m 0755 "$f" "$BIN/.$b.new" && mv -f "$BIN/.$b.new" "$BIN/$b"
done
# A binary of an older build left next to this one would pass for it under the new stamp.
for b in "${ALL[@]}"; do
  [[ " ${BINARIES[*]} " == *" $b "* ]] || rm -f "$BIN/$b"
done
echo "$KEY" > "$BIN/.build-key"
if [ "${ANCHORAGE_K8S_KEEP_BUILD:-0}" != "1" ]; then
  say "removing build tree (set ANCHORAGE_K8S_KEEP_BUILD=1 to keep it)"
  rm -rf "$SRC" "$WORK/home"
fi
"$BIN/kube-apiserver" --version >&2
say "cached: $BIN"
echo "$BIN"
