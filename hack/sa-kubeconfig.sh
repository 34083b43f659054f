#!/usr/bin/env bash
# Writes a kubeconfig that authenticates as a ServiceAccount of the local cluster, with a token
# from the TokenRequest API, so that a program (the operator, Prometheus) runs with exactly the
# rights its RBAC grants it, not the admin's.
#
# Usage: hack/sa-kubeconfig.sh NAMESPACE SERVICEACCOUNT OUT [DURATION]   (DURATION: e.g. 24h)
# The ServiceAccount must exist. Uses the admin kubeconfig in .local/kubeconfig
# (or $SPECTUNE_ADMIN_KUBECONFIG) to ask for the token.
set -euo pipefail

[[ $# -ge 3 && $# -le 4 ]] || { echo "usage: $0 NAMESPACE SERVICEACCOUNT OUT [DURATION]" >&2; exit 2; }
ns="$1" sa="$2" out="$3" duration="${4:-24h}"
root="$(cd "$(dirname "$0")/.." && pwd)"
admin="${SPECTUNE_ADMIN_KUBECONFIG:-$root/.local/kubeconfig}"
kubectl=("$root/.local/bin/kubectl" --kubeconfig "$admin")

token="$("${kubectl[@]}" create token "$sa" -n "$ns" --duration "$duration")"
server="$("${kubectl[@]}" config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
ca="$("${kubectl[@]}" config view --raw --minify \
  -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"

umask 077
mkdir -p "$(dirname "$out")"
cat >"$out.tmp" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
  - name: spectune-local
    cluster:
      server: $server
      certificate-authority-data: $ca
users:
  - name: system:serviceaccount:$ns:$sa
    user:
      token: $token
contexts:
  - name: $ns-$sa
    context:
      cluster: spectune-local
      namespace: $ns
      user: system:serviceaccount:$ns:$sa
current-context: $ns-$sa
KUBECONFIG
mv "$out.tmp" "$out"
echo "wrote $out for system:serviceaccount:$ns:$sa (token valid for $duration)"
