#!/usr/bin/env bash
# The images the one-node cluster runs, assembled here (no registry is
# reachable) with buildah from scratch and imported into containerd's
# k8s.io namespace under the names the chart and the examples use:
#
#   leasehold.local/pause:1        the sandbox image: a static C program
#                                  that waits for signals and reaps children
#   leasehold/leasehold:0.1.0      LEASEHOLD_BIN (default target/release/leasehold)
#                                  and the shared libraries it loads
#   redis:7.2-alpine               Debian's redis-server and its libraries
#   hashicorp/http-echo:1.0        a static C stand-in: -listen=:PORT -text=TEXT
#
#   scripts/kubernetes/images.sh WORKDIR CONTAINERD_SOCKET
set -euo pipefail
work="$1"
sock="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
leasehold_bin="${LEASEHOLD_BIN:-$root/target/release/leasehold}"
[ -x "$leasehold_bin" ] || { echo "error: $leasehold_bin missing (cargo build --release)" >&2; exit 1; }
mkdir -p "$work"

gcc -static -O2 -o "$work/pause" "$here/pause.c"
gcc -static -O2 -o "$work/http-echo" "$here/http-echo.c"

# FILES... -> their paths plus every shared library they load, as a tree.
tree_of() {
  local dest="$1"; shift
  rm -rf "$dest"
  mkdir -p "$dest/tmp" "$dest/etc"
  chmod 1777 "$dest/tmp"
  echo "nobody:x:65534:65534:nobody:/:/sbin/nologin" >"$dest/etc/passwd"
  for f in "$@"; do
    mkdir -p "$dest$(dirname "$f")"
    cp -L "$f" "$dest$f"
    { ldd "$f" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
      mkdir -p "$dest$(dirname "$lib")"
      cp -L "$lib" "$dest$lib"
    done
  done
}

# NAME TREE ENTRYPOINT-JSON USER: an image from scratch, imported.
image() {
  local name="$1" tree="$2" entrypoint="$3" user="$4"
  local c
  c="$(buildah from scratch)"
  buildah copy --quiet "$c" "$tree" / >/dev/null
  buildah config --entrypoint "$entrypoint" --user "$user" --cmd '' "$c"
  buildah commit --quiet "$c" "localhost/$name" >/dev/null
  buildah rm "$c" >/dev/null
  rm -f "$work/image.tar"
  buildah push --quiet "localhost/$name" "docker-archive:$work/image.tar:$name" >/dev/null
  ctr --address "$sock" -n k8s.io images import "$work/image.tar" >/dev/null
  echo "   $name" >&2
}

tree_of "$work/pause-root" "$work/pause"
mv "$work/pause-root/$work/pause" "$work/pause-root/pause"
image leasehold.local/pause:1 "$work/pause-root" '["/pause"]' 65535

tree_of "$work/leasehold-root" "$leasehold_bin"
cp -L "$leasehold_bin" "$work/leasehold-root/leasehold"
image leasehold/leasehold:0.1.0 "$work/leasehold-root" '["/leasehold"]' 65532:65532

tree_of "$work/redis-root" "$(command -v redis-server)"
image redis:7.2-alpine "$work/redis-root" "[\"$(command -v redis-server)\"]" 999:999

tree_of "$work/echo-root" "$work/http-echo"
cp "$work/http-echo" "$work/echo-root/http-echo"
image hashicorp/http-echo:1.0 "$work/echo-root" '["/http-echo"]' 65534
