#!/usr/bin/env bash
# Cluster DNS for the one-node cluster: every second, the Services' names
# (NAME.NAMESPACE.svc.cluster.local and the shorter forms) are written into
# dnsmasq's hosts file, and dnsmasq is told to read it again when it changed.
#   scripts/kubernetes/dns.sh DIR   (run inside the cluster's namespace)
set -uo pipefail
dir="$1"
export KUBECONFIG="$dir/admin.kubeconfig"
while sleep 1; do
  kubectl get services --all-namespaces --no-headers \
    -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name,IP:.spec.clusterIP 2>/dev/null |
    awk '$3 != "None" && $3 != "<none>" { printf "%s %s.%s.svc.cluster.local %s.%s.svc %s.%s\n", $3, $2, $1, $2, $1, $2, $1 }' \
      >"$dir/dns-hosts.new"
  if ! cmp -s "$dir/dns-hosts.new" "$dir/dns-hosts"; then
    mv "$dir/dns-hosts.new" "$dir/dns-hosts"
    kill -HUP "$(cat "$dir/dnsmasq.pid")" 2>/dev/null
  fi
done
