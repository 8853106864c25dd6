#!/usr/bin/env bash
# Build kube-apiserver and kube-controller-manager 1.20 from Debian's `kubernetes` source
# package (no prebuilt binaries are reachable here) and cache them outside the repository.
# Idempotent: exits at once when both binaries are cached. See ENVIRONMENT.md
# ("A real Kubernetes API server") for why each step exists.
#
#   ANCHORAGE_K8S_CACHE   cache directory (default ~/.cache/anchorage/k8s-1.20)
#   prints the cache directory's bin/ path on success as its last line.
set -euo pipefail
CACHE="${ANCHORAGE_K8S_CACHE:-$HOME/.cache/anchorage/k8s-1.20}"
BIN="$CACHE/bin"
say() { printf '\033[1m[k8s]\033[0m %s\n' "$*" >&2; }

if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ]; then
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
if [ ! -f "$SRC/.prepared" ]; then
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
  )
  touch "$SRC/.prepared"
fi

say "building kube-apiserver and kube-controller-manager (~5 min cold, ~2.4 GB build cache)"
mkdir -p "$WORK/home"
( cd "$SRC" && HOME="$WORK/home" CGO_ENABLED=0 make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" )
for b in kube-apiserver kube-controller-manager; do
  f=$(find "$SRC/_output" -type f -name "$b" -perm -u+x | head -1)
  [ -n "$f" ] || { say "build produced no $b"; exit 1; }
  install -m 0755 "$f" "$BIN/$b"
done
if [ "${ANCHORAGE_K8S_KEEP_BUILD:-0}" != "1" ]; then
  say "removing build tree (set ANCHORAGE_K8S_KEEP_BUILD=1 to keep it)"
  rm -rf "$SRC" "$WORK/home"
fi
"$BIN/kube-apiserver" --version >&2
say "cached: $BIN"
echo "$BIN"
