#!/usr/bin/env bash
# A real, local Kubernetes control plane and Prometheus for the tests and the demo:
# etcd, kube-apiserver (RBAC on), kube-controller-manager, kube-scheduler, kwok keeping fake
# GPU nodes, Prometheus with pod discovery, and the pod runner that starts a real engine
# behind every engine pod. Everything listens on 127.0.0.1; state, logs and pids live in .local/.
#
# Two Prometheus servers, for two setups users run:
# - "prometheus" (SPECTUNE_PROMETHEUS_URL) has a hand-written configuration
#   (hack/cluster/prometheus.yml.in): pods found by their prometheus.io/* annotations, and
#   engine pods without them as a PodMonitor would find them, scraped every 2 s so that the
#   tests' and the demo's short calibration windows hold enough scrapes.
#   The tests and the demo that watch the autotuner decide use it.
# - "prometheus-kps" (SPECTUNE_KPS_PROMETHEUS_URL) runs what the Prometheus Operator generates
#   from a Prometheus object shaped as kube-prometheus-stack's (hack/cluster/prometheus-kps.yaml.in:
#   monitors labelled `release: kps`, 30 s scrapes); hack/config_reloader.py plays the
#   config-reloader sidecar. The Prometheus Operator's CRDs are the real ones, from its module.
#
# Usage: hack/cluster.sh up|down|status
#
# Network rule: only loopback addresses ever receive traffic. Node addresses and pod CIDRs are
# in 127.0.0.0/8 (hack/cluster/nodes.yaml, kwok's --cidr/--node-ip), and so is the Service
# range, although nothing here routes or dials ClusterIPs (there is no kube-proxy).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
local_dir="$root/.local"
bin="$local_dir/bin"
pki="$local_dir/pki"
run="$local_dir/run"
logs="$local_dir/logs"
state="$local_dir/state"
cfg="$root/hack/cluster"
kubeconfig="$local_dir/kubeconfig"
python="${SPECTUNE_PYTHON:-$root/.venv/bin/python}"

etcd_port="${SPECTUNE_ETCD_PORT:-12379}"
etcd_peer_port="${SPECTUNE_ETCD_PEER_PORT:-12380}"
api_port="${SPECTUNE_API_PORT:-16443}"
kcm_port="${SPECTUNE_KCM_PORT:-20257}"
sched_port="${SPECTUNE_SCHEDULER_PORT:-20259}"
kwok_port="${SPECTUNE_KWOK_PORT:-20250}"
prom_port="${SPECTUNE_PROMETHEUS_PORT:-19090}"
kps_port="${SPECTUNE_KPS_PROMETHEUS_PORT:-19091}"
prom_operator_port="${SPECTUNE_PROMETHEUS_OPERATOR_PORT:-20270}"
api="https://127.0.0.1:$api_port"

# Start order (`down` stops the clients first, then the API server, then etcd).
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok prometheus pod-runner
  prometheus-operator prometheus-kps config-reloader)

log() { echo "cluster: $*"; }
die() { echo "cluster: $*" >&2; exit 1; }

kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

pid_of() { [[ -f "$run/$1.pid" ]] && cat "$run/$1.pid"; }

alive() {
  local pid
  pid="$(pid_of "$1")" || return 1
  kill -0 "$pid" 2>/dev/null
}

# Each component runs in a session of its own (setsid), so its pid is also its process group
# and `down` can end it together with anything it started (the pod runner's engines).
# SPECTUNE_CLUSTER_DIR marks them (and what they start) for the test that nothing is left.
start() {
  local name="$1"
  shift
  SPECTUNE_CLUSTER_DIR="$local_dir" setsid "$@" >>"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

api_curl() {
  curl -sf --max-time 3 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "$api$1"
}

# One health check a component; each answers 0 when the component is serving.
healthy() {
  case "$1" in
    etcd) curl -sf --max-time 3 "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"' ;;
    kube-apiserver) [[ "$(api_curl /readyz)" == ok ]] ;;
    # These two serve their health on self-signed certificates of their own.
    kube-controller-manager) [[ "$(curl -skf --max-time 3 "https://127.0.0.1:$kcm_port/healthz")" == ok ]] ;;
    kube-scheduler) [[ "$(curl -skf --max-time 3 "https://127.0.0.1:$sched_port/healthz")" == ok ]] ;;
    kwok) curl -sf --max-time 3 "http://127.0.0.1:$kwok_port/healthz" >/dev/null && nodes_ready ;;
    prometheus) curl -sf --max-time 3 "http://127.0.0.1:$prom_port/-/ready" >/dev/null ;;
    pod-runner) [[ -f "$run/pod-runner.ready" ]] ;;
    prometheus-operator) curl -sf --max-time 3 "http://127.0.0.1:$prom_operator_port/healthz" >/dev/null ;;
    prometheus-kps) curl -sf --max-time 3 "http://127.0.0.1:$kps_port/-/ready" >/dev/null ;;
    config-reloader) [[ -f "$run/config-reloader.ready" ]] ;;
  esac
}

nodes_ready() {
  local want have
  want="$(grep -c 'kind: Node$' "$cfg/nodes.yaml")"
  have="$(kubectl get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' \
    2>/dev/null | grep -c True)" || true
  [[ "$have" == "$want" ]]
}

wait_for() {
  local name="$1" timeout="$2" t0=$SECONDS
  until healthy "$name"; do
    alive "$name" || die "$name exited; see $logs/$name.log"
    ((SECONDS - t0 < timeout)) || die "$name not ready after ${timeout}s; see $logs/$name.log"
    sleep 0.3
  done
}

# --- certificates and kubeconfigs, made once and kept across up/down ---------------------

cert() {
  # cert NAME SUBJECT [SAN]: an EC key and a certificate signed by the local CA.
  local name="$1" subj="$2" san="${3:-}" ext
  [[ -f "$pki/$name.crt" ]] && return
  openssl ecparam -genkey -name prime256v1 -noout -out "$pki/$name.key" 2>/dev/null
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  ext="$pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n "$san" ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

cert_kubeconfig() {
  # cert_kubeconfig OUT USER: a kubeconfig that authenticates with USER's client certificate.
  local out="$1" user="$2"
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: spectune-local
    cluster:
      server: $api
      certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
  - name: $user
    user:
      client-certificate-data: $(base64 -w0 <"$pki/$user.crt")
      client-key-data: $(base64 -w0 <"$pki/$user.key")
contexts:
  - name: spectune-local
    context:
      cluster: spectune-local
      user: $user
current-context: spectune-local
EOF
  chmod 600 "$out"
}

make_pki() {
  mkdir -p "$pki"
  chmod 700 "$pki"
  if [[ ! -f "$pki/ca.crt" ]]; then
    log "making a local CA, serving and client certificates, service-account keys"
    openssl ecparam -genkey -name prime256v1 -noout -out "$pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=spectune-local-ca" -days 3650 \
      -sha256 -out "$pki/ca.crt" 2>/dev/null
  fi
  cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost"
  # The admin is in system:masters; kwok, which plays the kubelet of every fake node and so
  # writes the status of nodes and pods, is too.
  cert admin "/O=system:masters/CN=spectune-admin"
  cert kwok "/O=system:masters/CN=kwok-controller"
  cert kube-controller-manager "/CN=system:kube-controller-manager"
  cert kube-scheduler "/CN=system:kube-scheduler"
  cert pod-runner "/O=system:masters/CN=spectune-pod-runner"
  # The Prometheus Operator and its config reloader stand in for cluster add-ons.
  cert prometheus-operator "/O=system:masters/CN=prometheus-operator"
  cert config-reloader "/O=system:masters/CN=prometheus-config-reloader"
  # The API server publishes its request-header settings for delegated authentication; without
  # them the controller manager and the scheduler log errors about a missing CA bundle.
  cert front-proxy-client "/CN=front-proxy-client"
  if [[ ! -f "$pki/sa.key" ]]; then
    openssl ecparam -genkey -name prime256v1 -noout -out "$pki/sa.key" 2>/dev/null
    openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  fi
  cert_kubeconfig "$kubeconfig" admin
  local c
  for c in kwok kube-controller-manager kube-scheduler pod-runner config-reloader; do
    cert_kubeconfig "$pki/$c.kubeconfig" "$c"
  done
}

# --- up / down / status --------------------------------------------------------------------

any_running() {
  local c
  for c in "${components[@]}"; do alive "$c" && return 0; done
  return 1
}

all_healthy() {
  local c
  for c in "${components[@]}"; do alive "$c" && healthy "$c" || return 1; done
}

up() {
  local t0=$SECONDS
  "$root/hack/build-binaries.sh" -q kubernetes etcd kwok prometheus prometheus-operator
  if all_healthy; then
    log "already up (kubeconfig: $kubeconfig)"
    return
  fi
  if any_running; then
    log "partly running: stopping what is left first"
    down
  fi
  if ! "$python" -c 'import kubernetes' 2>/dev/null; then
    die "the pod runner needs $python with the kubernetes client (run: make install)"
  fi
  # A start-up that fails half-way stops what it started (its logs stay in .local/logs).
  trap 'rc=$?; if ((rc != 0)); then log "start-up failed; stopping what started"; down; fi' EXIT
  # Last run's logs are kept beside this run's, in logs.prev.
  rm -rf "$logs.prev"
  [[ -d "$logs" ]] && mv "$logs" "$logs.prev"
  mkdir -p "$run" "$logs"
  rm -rf "$state" "${run:?}"/*
  mkdir -p "$state"
  : >"$logs/up.log"
  make_pki
  cat >"$local_dir/cluster.env" <<EOF
SPECTUNE_KUBECONFIG=$kubeconfig
SPECTUNE_API_SERVER=$api
SPECTUNE_PROMETHEUS_URL=http://127.0.0.1:$prom_port
SPECTUNE_KPS_PROMETHEUS_URL=http://127.0.0.1:$kps_port
SPECTUNE_ETCD_URL=http://127.0.0.1:$etcd_port
EOF

  log "starting etcd on 127.0.0.1:$etcd_port"
  start etcd "$bin/etcd" --name spectune --data-dir "$state/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "spectune=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --log-level warn
  wait_for etcd 30

  log "starting kube-apiserver on $api"
  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port "$api_port" \
    --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
    --service-cluster-ip-range 127.0.192.0/20 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins OwnerReferencesPermissionEnforcement \
    --client-ca-file "$pki/ca.crt" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --service-account-issuer "$api" \
    --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" \
    --requestheader-client-ca-file "$pki/ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy-client.crt" \
    --proxy-client-key-file "$pki/front-proxy-client.key" \
    --audit-policy-file "$cfg/audit-policy.yaml" --audit-log-path "$logs/audit.log" \
    --audit-log-format json --audit-log-maxsize 200 --audit-log-maxbackup 4 \
    --profiling=false --v 1
  # The others start once the API server has made its bootstrap RBAC policies: the controller
  # manager exits if it is denied at start.
  wait_for kube-apiserver 120
  log "starting kube-controller-manager, kube-scheduler and kwok"
  # Without the Endpoints/EndpointSlice controllers: the API server refuses loopback endpoint
  # addresses, so they would only warn (FailedToUpdateEndpoint) for every Service, again and
  # again, and nothing here reads Endpoints (Prometheus discovers pods; no kube-proxy).
  start kube-controller-manager "$bin/kube-controller-manager" \
    --controllers '*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller' \
    --kubeconfig "$pki/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$pki/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$pki/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" \
    --cert-dir "$state/kube-controller-manager" \
    --leader-elect=false --use-service-account-credentials \
    --root-ca-file "$pki/ca.crt" \
    --profiling=false --v 1
  start kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$pki/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$pki/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$pki/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" \
    --cert-dir "$state/kube-scheduler" \
    --leader-elect=false --v 1
  start kwok "$bin/kwok" --config "$cfg/kwok.yaml" \
    --kubeconfig "$pki/kwok.kubeconfig" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --cidr 127.0.1.0/24 --node-ip 127.0.0.10 \
    --server-address "127.0.0.1:$kwok_port" --node-port "$kwok_port" \
    --node-lease-duration-seconds 40

  log "creating the fake GPU nodes and Prometheus' ServiceAccount"
  kubectl apply -f "$cfg/nodes.yaml" -f "$cfg/prometheus-rbac.yaml" >>"$logs/up.log"
  mkdir -p "$state/prometheus"
  "$root/hack/sa-kubeconfig.sh" monitoring prometheus "$state/prometheus/kubeconfig" 8760h \
    >>"$logs/up.log"
  sed "s|@KUBECONFIG@|$state/prometheus/kubeconfig|" "$cfg/prometheus.yml.in" \
    >"$state/prometheus/prometheus.yml"
  log "starting Prometheus on 127.0.0.1:$prom_port and the pod runner"
  start prometheus "$bin/prometheus" --config.file "$state/prometheus/prometheus.yml" \
    --storage.tsdb.path "$state/prometheus/data" --storage.tsdb.retention.time 1d \
    --web.listen-address "127.0.0.1:$prom_port" --web.enable-lifecycle --log.level warn
  start pod-runner "$python" "$root/hack/pod_runner.py" --kubeconfig "$pki/pod-runner.kubeconfig" \
    --state-dir "$state/pods" --ready-file "$run/pod-runner.ready"

  start_prometheus_operator

  local c
  for c in kube-controller-manager kube-scheduler kwok prometheus pod-runner prometheus-kps \
    config-reloader; do
    wait_for "$c" 90
  done
  trap - EXIT
  log "ready in $((SECONDS - t0)) s; export KUBECONFIG=$kubeconfig;" \
    "Prometheus at http://127.0.0.1:$prom_port"
}

# The Prometheus Operator with its real CRDs (from its Go module, which the build fetched), the
# Prometheus object, a Prometheus for it on 127.0.0.1:$kps_port that starts with no scrape jobs,
# and the reloader that gives it the generated configuration.
start_prometheus_operator() {
  local crds version
  crds="$(cd "$root/hack/tools/prometheus-operator" &&
    go mod download github.com/prometheus-operator/prometheus-operator &&
    go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)/example/prometheus-operator-crd"
  log "applying the Prometheus Operator's CRDs; starting it on 127.0.0.1:$prom_operator_port"
  # server-side: the Prometheus CRD is too large for the last-applied annotation
  kubectl apply --server-side -f "$crds" >>"$logs/up.log"
  kubectl wait --for condition=Established --timeout 60s -f "$crds" >>"$logs/up.log"
  start prometheus-operator "$bin/prometheus-operator" \
    --apiserver "$api" --ca-file "$pki/ca.crt" \
    --cert-file "$pki/prometheus-operator.crt" --key-file "$pki/prometheus-operator.key" \
    --web.listen-address "127.0.0.1:$prom_operator_port" --log-level warn
  version="$("$bin/prometheus" --version | sed -n 's/^prometheus, version \([^ ]*\).*/v\1/p')"
  sed "s|@VERSION@|$version|" "$cfg/prometheus-kps.yaml.in" | kubectl apply -f - >>"$logs/up.log"
  mkdir -p "$state/prometheus-kps"
  printf 'global:\n  scrape_interval: 30s\n' >"$state/prometheus-kps/prometheus.yml"
  log "starting Prometheus for the Prometheus object monitoring/kps on 127.0.0.1:$kps_port"
  start prometheus-kps "$bin/prometheus" --config.file "$state/prometheus-kps/prometheus.yml" \
    --storage.tsdb.path "$state/prometheus-kps/data" --storage.tsdb.retention.time 1d \
    --web.listen-address "127.0.0.1:$kps_port" --web.enable-lifecycle --log.level warn
  start config-reloader "$python" "$root/hack/config_reloader.py" \
    --kubeconfig "$pki/config-reloader.kubeconfig" --namespace monitoring --name kps \
    --prometheus-kubeconfig "$state/prometheus/kubeconfig" \
    --prometheus "http://127.0.0.1:$kps_port" --state-dir "$state/prometheus-kps" \
    --ready-file "$run/config-reloader.ready"
}

# True while a process of group PGID is alive. Exited ones linger as zombies until init reaps
# them, which can take seconds; they hold nothing, so they do not count.
group_alive() {
  local p
  for p in $(pgrep -g "$1"); do
    [[ "$(ps -o stat= -p "$p" 2>/dev/null)" == Z* ]] || return 0
  done
  return 1
}

# stop NAME...: SIGTERM to each one's process group, then wait for all of them (the whole
# group, not only its leader) and SIGKILL what is left after 10 s.
stop() {
  local c pid _
  for c in "$@"; do
    pid="$(pid_of "$c")" || continue
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  for c in "$@"; do
    pid="$(pid_of "$c")" || continue
    for _ in $(seq 1 50); do
      group_alive "$pid" || break
      sleep 0.2
    done
    if group_alive "$pid"; then
      log "$c did not stop in 10 s; killing it"
      kill -KILL -- "-$pid" 2>/dev/null || true
      sleep 0.2
    fi
    rm -f "$run/$c.pid"
  done
}

down() {
  # Clients first, then the API server while etcd still answers (it hangs on shutdown
  # otherwise), then etcd.
  stop config-reloader prometheus-kps prometheus-operator
  stop pod-runner prometheus kwok kube-scheduler kube-controller-manager
  stop kube-apiserver
  stop etcd
  rm -f "$run/pod-runner.ready" "$run/config-reloader.ready"
  rm -rf "$state"
  log "down"
}

status() {
  local c pid rc=0 word
  for c in "${components[@]}"; do
    if ! pid="$(pid_of "$c")" || ! kill -0 "$pid" 2>/dev/null; then
      word="stopped"
      rc=1
    elif healthy "$c"; then
      word="ready (pid $pid)"
    else
      word="running, not ready (pid $pid)"
      rc=1
    fi
    printf '%-24s %s\n' "$c" "$word"
  done
  if ((rc == 0)); then
    echo
    echo "kubeconfig: $kubeconfig   Prometheus: http://127.0.0.1:$prom_port" \
      "(the Prometheus Operator's: http://127.0.0.1:$kps_port)"
    kubectl get nodes \
      -o custom-columns='NODE:.metadata.name,IP:.status.addresses[0].address,GPU:.metadata.labels.nvidia\.com/gpu\.product,GPUS:.status.allocatable.nvidia\.com/gpu'
  fi
  return "$rc"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up|down|status" ;;
esac
