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
#   busybox:1.36                   Debian's busybox-static (the README's probe pod)
#   your-report-image-with-leasehold:1.4
#                                  examples/singleton-exec.yaml's job image: busybox,
#                                  redis-cli, the leasehold binary as its entrypoint
#                                  and a run-report stand-in that records in Redis,
#                                  every 200 ms, which pod runs it under which term
#
#   scripts/kubernetes/images.sh WORKDIR CONTAINERD_SOCKET
set -euo pipefail
work="$1"
sock="$2"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
leasehold_bin="${LEASEHOLD_BIN:-$root/target/release/leasehold}"
[ -x "$leasehold_bin" ] || { echo "error: $leasehold_bin missing (cargo build --release -p leasehold)" >&2; exit 1; }
mkdir -p "$work"
# Debug symbols stay out of the images (a test build carries 70 MB of them).
strip --strip-debug -o "$work/leasehold" "$leasehold_bin"
leasehold_bin="$work/leasehold"

gcc -static -O2 -o "$work/pause" "$here/pause.c"
gcc -static -O2 -o "$work/http-echo" "$here/http-echo.c"

# DEST FILE[:PATH]... -> a tree with each FILE at PATH (default: its own
# path) and every shared library it loads.
tree_of() {
  local dest="$1"; shift
  rm -rf "$dest"
  mkdir -p "$dest/tmp" "$dest/etc"
  chmod 1777 "$dest/tmp"
  echo "nobody:x:65534:65534:nobody:/:/sbin/nologin" >"$dest/etc/passwd"
  local f at
  for f in "$@"; do
    at="${f#*:}"
    f="${f%%:*}"
    mkdir -p "$dest$(dirname "$at")"
    cp -L "$f" "$dest$at"
    { ldd "$f" 2>/dev/null || true; } | { grep -o '/[^ ]*' || true; } | while read -r lib; do
      mkdir -p "$dest$(dirname "$lib")"
      cp -L "$lib" "$dest$lib"
    done
  done
}

# NAME TREE ENTRYPOINT-JSON USER [CMD]: an image from scratch, imported.
image() {
  local name="$1" tree="$2" entrypoint="$3" user="$4" cmd="${5:-}"
  local c
  c="$(buildah from scratch)"
  buildah copy --quiet "$c" "$tree" / >/dev/null
  buildah config --entrypoint "$entrypoint" --user "$user" --cmd "$cmd" \
    --env PATH=/usr/local/bin:/usr/bin:/bin "$c"
  buildah commit --quiet "$c" "localhost/$name" >/dev/null
  buildah rm "$c" >/dev/null
  rm -f "$work/image.tar"
  buildah push --quiet "localhost/$name" "docker-archive:$work/image.tar:$name" >/dev/null
  ctr --address "$sock" -n k8s.io images import "$work/image.tar" >/dev/null
  echo "   $name" >&2
}

tree_of "$work/pause-root" "$work/pause:/pause"
image leasehold.local/pause:1 "$work/pause-root" '["/pause"]' 65535

tree_of "$work/leasehold-root" "$leasehold_bin:/leasehold"
image leasehold/leasehold:0.1.0 "$work/leasehold-root" '["/leasehold"]' 65532:65532

tree_of "$work/redis-root" "$(command -v redis-server)"
image redis:7.2-alpine "$work/redis-root" "[\"$(command -v redis-server)\"]" 999:999

tree_of "$work/echo-root" "$work/http-echo:/http-echo"
image hashicorp/http-echo:1.0 "$work/echo-root" '["/http-echo"]' 65534

# A busybox tree: the static binary and a link for each applet.
busybox_tree() {
  local dest="$1"
  mkdir -p "$dest/bin"
  cp -L "$(command -v busybox)" "$dest/bin/busybox"
  for applet in $("$dest/bin/busybox" --list); do
    [ -e "$dest/bin/$applet" ] || ln -s busybox "$dest/bin/$applet"
  done
}

tree_of "$work/busybox-root"
busybox_tree "$work/busybox-root"
# As Docker Hub's: no entrypoint, so `kubectl run ... -- wget ...` runs wget.
image busybox:1.36 "$work/busybox-root" '[]' 0 sh

tree_of "$work/report-root" "$leasehold_bin:/usr/local/bin/leasehold" "$(command -v redis-cli)"
busybox_tree "$work/report-root"
cat >"$work/report-root/usr/local/bin/run-report" <<'SH'
#!/bin/sh
# A stand-in for the example's report: it never finishes, and every 200 ms
# appends "POD TERM" to the Redis list nightly-report:runs, so a test can
# see from the list's order whether two pods ever ran it at once.
[ "$1" = --term ] && term="$2"
while :; do
  redis-cli -h leasehold-redis.leasehold-system.svc RPUSH nightly-report:runs "$POD_NAME $term" >/dev/null
  sleep 0.2
done
SH
chmod +x "$work/report-root/usr/local/bin/run-report"
image your-report-image-with-leasehold:1.4 "$work/report-root" '["/usr/local/bin/leasehold", "agent"]' 65532:65532
