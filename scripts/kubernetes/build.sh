#!/usr/bin/env bash
# Builds the Kubernetes 1.20 binaries the test harness runs, from Debian's
# `kubernetes` source package, once: the result is cached outside the repo
# (default ~/.cache/leasehold-ci/kubernetes-1.20/bin) and a second run that
# finds the binaries does nothing.
#
#   scripts/kubernetes/build.sh apiserver   kube-apiserver only (the API-server suite)
#   scripts/kubernetes/build.sh cluster     also kubelet, kube-proxy, controller-manager, scheduler
#
# Also installs, from Debian's packages, what the build and the harness need:
# golang-1.19-go, rsync, make, dpkg-dev, etcd-server, and kubernetes-client
# (kubectl) where no kubectl is on the PATH.
# Prints the bin directory on its last line.
set -euo pipefail

stage="${1:-apiserver}"
case "$stage" in
  apiserver) targets=(cmd/kube-apiserver) ;;
  cluster) targets=(cmd/kube-apiserver cmd/kubelet cmd/kube-proxy cmd/kube-controller-manager cmd/kube-scheduler) ;;
  *) echo "usage: $0 apiserver|cluster" >&2; exit 2 ;;
esac

cache="${XDG_CACHE_HOME:-$HOME/.cache}/leasehold-ci/kubernetes-1.20"
bin="$cache/bin"
mkdir -p "$bin"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
export DEBIAN_FRONTEND=noninteractive
updated=
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing ${missing[*]} (Debian packages)" >&2
  if [ -z "$updated" ]; then as_root apt-get update -qq; updated=1; fi
  as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What the harness runs besides the built binaries: etcd, openssl for the
# certificates, and kubectl (any kubectl already on the machine will do).
apt_install etcd-server openssl
command -v kubectl >/dev/null 2>&1 || apt_install kubernetes-client

todo=()
for t in "${targets[@]}"; do [ -x "$bin/$(basename "$t")" ] || todo+=("$t"); done
if [ ${#todo[@]} -eq 0 ]; then
  echo "$bin"
  exit 0
fi

apt_install golang-1.19-go rsync make dpkg-dev golang-github-modern-go-reflect2-dev

src="$cache/src"
if [ ! -d "$src/cmd/kube-apiserver" ]; then
  # `apt-get source` needs a deb-src line; add one for the same archive as
  # the machine's deb lines (its own file, so the machine's are untouched).
  srcfile=/etc/apt/sources.list.d/leasehold-deb-src.sources
  if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "== adding deb-src for the Debian archive ($srcfile)" >&2
    tmp="$(mktemp)"
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -e "$f" ] || continue
      sed -e 's/^Types: deb$/Types: deb-src/' "$f" >>"$tmp"
      echo >>"$tmp"
    done
    if [ -e /etc/apt/sources.list ]; then
      sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >"$tmp.list"
      [ -s "$tmp.list" ] && as_root cp "$tmp.list" /etc/apt/sources.list.d/leasehold-deb-src.list
    fi
    [ -s "$tmp" ] && as_root cp "$tmp" "$srcfile"
    rm -f "$tmp" "$tmp.list"
    as_root apt-get update -qq
  fi
  echo "== fetching Debian's kubernetes source package" >&2
  work="$cache/source.tmp"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$work" && apt-get source -qq kubernetes >/dev/null)
  dir="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
  [ -n "$dir" ] || { echo "error: apt-get source kubernetes made no source tree" >&2; exit 1; }
  rm -rf "$src"
  mv "$dir" "$src"
  rm -rf "$work"
fi

# Go 1.19 and the vendored reflect2 1.0.1 do not agree on the runtime's map
# layout: the binaries die at their first requests ("fatal error: fault").
# reflect2 1.0.2, as Debian packages it, is the fix.
r2="$src/vendor/github.com/modern-go/reflect2"
if [ ! -e "$r2/.leasehold-1.0.2" ]; then
  echo "== replacing vendored reflect2 with Debian's 1.0.2" >&2
  rm -rf "$r2"
  mkdir -p "$r2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2/. "$r2/"
  rm -f "$r2/go.mod" "$r2/go.sum"
  touch "$r2/.leasehold-1.0.2"
fi

# Debian's rules build in GOPATH mode, from a GOPATH made of a symlink.
mkdir -p "$src/.go/src/k8s.io"
ln -sfn "$src" "$src/.go/src/k8s.io/kubernetes"
echo "== building ${todo[*]} (Go 1.19, GOPATH mode; several minutes each on 2 cores)" >&2
start=$SECONDS
(
  cd "$src/.go/src/k8s.io/kubernetes"
  export GOPATH="$src/.go" GO111MODULE=off CGO_ENABLED=0 GOFLAGS= GOCACHE="$cache/gocache"
  export PATH="/usr/lib/go-1.19/bin:$PATH"
  export KUBE_GIT_VERSION="v1.20.2" KUBE_GIT_TREE_STATE=clean
  make WHAT="${todo[*]}" >&2
)
for t in "${todo[@]}"; do
  name="$(basename "$t")"
  built="$(find "$src/_output" -type f -name "$name" -path '*/bin/*' | head -1)"
  [ -n "$built" ] || { echo "error: make built no $name" >&2; exit 1; }
  cp "$built" "$bin/$name"
done
echo "== built in $((SECONDS - start)) s" >&2
echo "$bin"
