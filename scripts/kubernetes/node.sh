#!/usr/bin/env bash
# A one-node Kubernetes 1.20 for the README path suite: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd, kubelet and kube-proxy,
# all inside a network namespace of their own with no route out of it. The
# node's address sits on a bridge in that namespace; pods get addresses on a
# second bridge there; Service IPs are routed to the node bridge, where
# kube-proxy's iptables rules rewrite them; cluster DNS is a dnsmasq whose
# hosts file is written from the Services (see `dns` below).
#
#   scripts/kubernetes/node.sh up DIR     start it, state and logs under DIR
#   scripts/kubernetes/node.sh down DIR   stop it and remove the namespace
#   scripts/kubernetes/node.sh run DIR CMD...   run CMD inside the namespace
#                                         with KUBECONFIG set (admin)
#
# Needs root. Installs from Debian's packages what it uses; the Kubernetes
# binaries come from build.sh cluster.
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|down|run DIR [CMD...]" >&2; exit 2; }
shift 2
case "$(realpath -m "$dir")" in
  / | /root | /home | /tmp | /var | /usr | /etc) echo "error: DIR must be a directory of its own, not $dir (up wipes it)" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "$0")" && pwd)"
ns=leasehold-k8s
node_ip=10.200.0.1
pod_cidr=10.201.0.0/24
service_cidr=10.96.0.0/12
dns_ip=10.96.0.10
node_name=leasehold-node
inside() { nsenter --net="/run/netns/$ns" "$@"; }

stop_all() {
  for pidfile in "$dir"/*.pid; do
    [ -e "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  for pidfile in "$dir"/*.pid; do
    [ -e "$pidfile" ] || continue
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # Containers outlive containerd: their shims are in the namespace too.
  if ip netns pids "$ns" >/dev/null 2>&1; then
    for pid in $(ip netns pids "$ns"); do kill -9 "$pid" 2>/dev/null || true; done
  fi
  mount | awk -v d="$dir" 'index($3, d) == 1 { print $3 }' | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  ip netns del "$ns" 2>/dev/null || true
  # The pods' own namespaces, made by the CNI plugins under /run/netns,
  # and the containers still running in them (their shims are gone). This
  # cluster is the only user of CNI on the machines it is meant for.
  for pod_ns in $(ip netns list | awk '/^cni-/ { print $1 }'); do
    for pid in $(ip netns pids "$pod_ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$pod_ns" 2>/dev/null || true
  done
}

case "$cmd" in
  down) stop_all; exit 0 ;;
  run)
    exec nsenter --net="/run/netns/$ns" env KUBECONFIG="$dir/admin.kubeconfig" "$@" ;;
  up) ;;
  *) echo "usage: $0 up|down|run DIR [CMD...]" >&2; exit 2 ;;
esac

export DEBIAN_FRONTEND=noninteractive
missing=()
for p in containerd runc containernetworking-plugins buildah dnsmasq-base iptables conntrack busybox-static curl binutils; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]} (Debian packages)" >&2
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
bin="$(bash "$here/build.sh" cluster | tail -n 1)"

stop_all
# A fresh cluster every time: no etcd data, containers or images left over.
rm -rf "$dir"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
start() { # NAME CMD... : runs CMD inside the namespace, logs to DIR/NAME.log
  local name="$1"; shift
  nsenter --net="/run/netns/$ns" "$@" >"$dir/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
}

echo "== network namespace $ns (node $node_ip, pods $pod_cidr)" >&2
ip netns add "$ns"
inside ip link set lo up
inside ip link add lh0 type bridge
inside ip addr add "$node_ip/24" dev lh0
inside ip addr add "$dns_ip/32" dev lh0
inside ip link set lh0 up
# Service IPs go to the node bridge, where kube-proxy rewrites them; nothing
# routes out of the namespace.
inside ip route add "$service_cidr" dev lh0
inside ip route add default dev lh0
inside sysctl -qw net.ipv4.ip_forward=1
inside sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || modprobe br_netfilter 2>/dev/null || true

echo "== certificates and tokens" >&2
pki="$dir/pki"
mkdir -p "$pki"
(
  cd "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=leasehold-node-ca 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
  echo "subjectAltName=IP:127.0.0.1,IP:$node_ip,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" >apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 2 -extfile apiserver.ext 2>/dev/null
  # The kubelet's serving certificate, for logs and exec through the API server.
  openssl req -newkey rsa:2048 -nodes -keyout kubelet.key -out kubelet.csr -subj "/CN=$node_name" 2>/dev/null
  echo "subjectAltName=IP:$node_ip,DNS:$node_name" >kubelet.ext
  openssl x509 -req -in kubelet.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet.crt -days 2 -extfile kubelet.ext 2>/dev/null
  # The API server's client certificate towards the kubelet (logs, exec,
  # attach), in system:masters so the kubelet's webhook authorization passes.
  openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
    -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
  openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet-client.crt -days 2 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
)
token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
: >"$pki/tokens.csv"
kubeconfig() { # USER GROUPS FILE
  local t; t="$(token)"
  echo "$t,$1,$1,\"$2\"" >>"$pki/tokens.csv"
  cat >"$3" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://$node_ip:6443
    certificate-authority: $pki/ca.crt
users:
- name: user
  user:
    token: $t
contexts:
- name: local
  context: {cluster: local, user: user}
current-context: local
EOF
}
kubeconfig admin system:masters "$dir/admin.kubeconfig"
# Every controller runs under this one identity (no per-controller
# ServiceAccount credentials), so it needs more than its bootstrap role.
kubeconfig system:kube-controller-manager system:masters "$dir/controller-manager.kubeconfig"
kubeconfig system:kube-scheduler "" "$dir/scheduler.kubeconfig"
kubeconfig "system:node:$node_name" system:nodes "$dir/kubelet.kubeconfig"
kubeconfig system:kube-proxy "" "$dir/kube-proxy.kubeconfig"

echo "== etcd, kube-apiserver, controller-manager, scheduler" >&2
start etcd etcd --name default --data-dir "$dir/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster default=http://127.0.0.1:2380 --log-level warn
start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --advertise-address="$node_ip" --secure-port=6443 --insecure-port=0 \
  --cert-dir="$pki" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/tokens.csv" \
  --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
  --kubelet-client-certificate="$pki/kubelet-client.crt" --kubelet-client-key="$pki/kubelet-client.key" \
  --authorization-mode=Node,RBAC --allow-privileged=true \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range="$service_cidr" --profiling=false --v=1
for _ in $(seq 1 600); do
  inside curl -sk --max-time 1 -H "Authorization: Bearer $(awk -F, 'NR==1{print $1}' "$pki/tokens.csv")" \
    "https://$node_ip:6443/readyz" 2>/dev/null | grep -qx ok && break
  sleep 0.2
done
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$dir/controller-manager.kubeconfig" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --leader-elect=false --use-service-account-credentials=false \
  --controllers='*,-nodeipam,-cloud-node-lifecycle,-route,-service,-csrsigning,-csrapproving,-bootstrapsigner,-tokencleaner' \
  --profiling=false --v=1
start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$dir/scheduler.kubeconfig" \
  --leader-elect=false --profiling=false --v=1

echo "== containerd and the node's images" >&2
mkdir -p "$dir/cni/net.d" "$dir/containerd"
cat >"$dir/cni/net.d/10-pods.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "pods",
  "plugins": [
    { "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$pod_cidr" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] } },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
cat >"$dir/containerd/config.toml" <<EOF
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "leasehold.local/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni/net.d"
EOF
start containerd containerd --config "$dir/containerd/config.toml"
for _ in $(seq 1 100); do [ -S "$dir/containerd/containerd.sock" ] && break; sleep 0.1; done
bash "$here/images.sh" "$dir/images" "$dir/containerd/containerd.sock"

echo "== kubelet and kube-proxy" >&2
cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
clusterDNS: [$dns_ip]
clusterDomain: cluster.local
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
start kubelet "$bin/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
  --container-runtime=remote --container-runtime-endpoint="unix://$dir/containerd/containerd.sock" \
  --node-ip="$node_ip" --hostname-override="$node_name" --root-dir="$dir/kubelet" \
  --cert-dir="$pki" --v=1
start kube-proxy "$bin/kube-proxy" --kubeconfig="$dir/kube-proxy.kubeconfig" \
  --proxy-mode=iptables --cluster-cidr="$pod_cidr" --hostname-override="$node_name" \
  --conntrack-max-per-core=0 --profiling=false --v=1

echo "== cluster DNS" >&2
: >"$dir/dns-hosts"
start dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --listen-address="$dns_ip" \
  --bind-interfaces --addn-hosts="$dir/dns-hosts" --domain-needed --log-facility=-
start dns bash "$here/dns.sh" "$dir"

for _ in $(seq 1 300); do
  KUBECONFIG="$dir/admin.kubeconfig" inside kubectl get node "$node_name" 2>/dev/null | grep -q ' Ready ' && break
  sleep 0.5
done
KUBECONFIG="$dir/admin.kubeconfig" inside kubectl get node "$node_name"
echo "$dir/admin.kubeconfig"
