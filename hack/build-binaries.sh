#!/usr/bin/env bash
# Builds the real parts the cluster tests and the demo run (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kwok, helm, Prometheus, the Prometheus Operator) from their Go modules at
# the versions pinned in hack/tools/*/go.mod, into .local/bin.
#
# Usage: hack/build-binaries.sh [-q] [GROUP...]   (groups: kubernetes etcd kwok prometheus helm
#                                                   prometheus-operator; default: all;
#                                                   -q: say nothing when cached)
#        hack/build-binaries.sh --check [GROUP...]  exit 0 when nothing needs compiling (each
#                                                   group installed or in the store), else 1
#
# Why it is shaped like this:
# - A group whose binaries are already in .local/bin with the same key (hash of its go.mod,
#   go.sum, build flags and Go version) is skipped, so a cached run takes well under a second.
# - Built binaries are also kept in a per-user store outside the repo
#   (SPECTUNE_TOOLS_CACHE, default ~/.cache/spectune/tools), so that a fresh clone on the same
#   machine (CI runs in one) copies them in seconds instead of compiling for many minutes.
# - GOCACHE and GOMODCACHE default to per-user folders outside the repo for the same reason.
# - Set SPECTUNE_BUILD_JOBS to cap `go build -p` on a busy machine (default: all cores).
set -euo pipefail
shopt -s inherit_errexit

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="$root/hack/tools"
bin_dir="${SPECTUNE_BIN_DIR:-$root/.local/bin}"
store="${SPECTUNE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spectune/tools}"
jobs="${SPECTUNE_BUILD_JOBS:-$(nproc)}"

command -v go >/dev/null || { echo "build-binaries: Go is required (go 1.26 or newer)" >&2; exit 1; }
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-build}"
export GOMODCACHE="${GOMODCACHE:-$(go env GOPATH | cut -d: -f1)/pkg/mod}"
# Our own flags, not the caller's, so that a build (and its cache key) is the same everywhere.
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0

all_groups=(kubernetes etcd kwok prometheus helm prometheus-operator)

# The version of MODULE that the tool module DIR requires.
module_version() {
  local v
  v="$(cd "$tools/$1" && go list -m -f '{{.Version}}' "$2")"
  [[ -n "$v" ]] || { echo "build-binaries: no version of $2 in hack/tools/$1" >&2; return 1; }
  echo "$v"
}

# Each group: the binaries it yields, the packages they come from, and build flags.
group_binaries() {
  case "$1" in
    kubernetes) echo "kube-apiserver kube-controller-manager kube-scheduler kubectl" ;;
    etcd) echo "etcd" ;;
    kwok) echo "kwok" ;;
    prometheus) echo "prometheus" ;;
    helm) echo "helm" ;;
    prometheus-operator) echo "prometheus-operator" ;;
    *) echo "build-binaries: unknown group '$1' (known: ${all_groups[*]})" >&2; return 1 ;;
  esac
}

group_packages() {
  case "$1" in
    kubernetes)
      local p=k8s.io/kubernetes/cmd
      echo "$p/kube-apiserver $p/kube-controller-manager $p/kube-scheduler $p/kubectl" ;;
    etcd) echo "go.etcd.io/etcd/server/v3" ;;
    kwok) echo "sigs.k8s.io/kwok/cmd/kwok" ;;
    prometheus) echo "github.com/prometheus/prometheus/cmd/prometheus" ;;
    helm) echo "helm.sh/helm/v3/cmd/helm" ;;
    prometheus-operator) echo "github.com/prometheus-operator/prometheus-operator/cmd/operator" ;;
  esac
}

group_tags() {
  case "$1" in
    # Kubernetes service discovery is the one optional discovery the tests use; leaving the
    # cloud discoveries out roughly halves Prometheus' compile time.
    prometheus) echo "remove_all_sd,enable_kubernetes_sd" ;;
    *) echo "" ;;
  esac
}

group_ldflags() {
  local flags="-s -w"
  case "$1" in
    kubernetes)
      # Without these the binaries report v0.0.0-master, which clients such as helm reject.
      local v minor
      v="$(module_version kubernetes k8s.io/kubernetes)"
      minor="$(echo "$v" | cut -d. -f2)"
      local x
      for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $x.gitVersion=$v -X $x.gitMajor=1 -X $x.gitMinor=$minor"
        flags+=" -X $x.gitTreeState=clean"
      done
      ;;
    prometheus)
      # Module v0.316.0 is Prometheus 3.16.0: its release number is in the module's VERSION.
      local dir
      dir="$(cd "$tools/prometheus" && go mod download github.com/prometheus/prometheus &&
        go list -m -f '{{.Dir}}' github.com/prometheus/prometheus)"
      flags+=" -X github.com/prometheus/common/version.Version=$(cat "$dir/VERSION")"
      ;;
    helm)
      flags+=" -X helm.sh/helm/v3/internal/version.version=$(module_version helm helm.sh/helm/v3)"
      ;;
    prometheus-operator)
      local v
      v="$(module_version prometheus-operator github.com/prometheus-operator/prometheus-operator)"
      flags+=" -X github.com/prometheus/common/version.Version=${v#v}"
      ;;
  esac
  echo "$flags"
}

group_key() {
  local g="$1"
  {
    cat "$tools/$g/go.mod" "$tools/$g/go.sum"
    go env GOVERSION GOOS GOARCH
    echo "$GOFLAGS|$CGO_ENABLED|$(group_tags "$g")|$(group_ldflags "$g")|$(group_packages "$g")"
  } | sha256sum | cut -c1-16
}

# Copies (hard-links where it can) a group's binaries from the store into bin_dir.
install_from() {
  local src="$1" g="$2" key="$3" b
  mkdir -p "$bin_dir"
  for b in $(group_binaries "$g"); do
    rm -f "$bin_dir/$b"
    ln "$src/$b" "$bin_dir/$b" 2>/dev/null || cp "$src/$b" "$bin_dir/$b"
  done
  echo "$key" >"$bin_dir/.$g.key"
}

# `go build -v` names each package as it compiles it, and go each module it downloads; print
# counts now and then so that a long cold build shows it is moving without flooding the log.
progress() {
  local label="$1"
  awk -v label="$label" '
    /^go: downloading / {
      d++; if (d % 50 == 0) { printf "  %s: %d modules downloaded\n", label, d; fflush() }; next
    }
    /[ :]/ { print; fflush(); next }
    { n++; if (n % 100 == 0) { printf "  %s: %d packages compiled\n", label, n; fflush() } }
    END { printf "  %s: %d packages compiled in total\n", label, n }'
}

build_group() {
  local g="$1" key out tmp start b
  key="$(group_key "$g")"
  local have=1
  for b in $(group_binaries "$g"); do [[ -x "$bin_dir/$b" ]] || have=0; done
  if [[ $have == 1 && -f "$bin_dir/.$g.key" && "$(cat "$bin_dir/.$g.key")" == "$key" ]]; then
    [[ $quiet == 1 ]] || echo "build-binaries: $g up to date ($(group_binaries "$g"))"
    return
  fi
  built=1
  out="$store/$g-$key"
  if [[ -f "$out/.complete" ]]; then
    echo "build-binaries: $g from the store $out"
    install_from "$out" "$g" "$key"
    return
  fi
  echo "build-binaries: building $g ($(group_binaries "$g")) with -p $jobs" \
    "(many minutes when the Go build cache is cold)"
  start=$SECONDS
  tmp="$store/.tmp-$g-$key"
  rm -rf "$store/.tmp-$g-"*  # what a failed or interrupted build left
  mkdir -p "$tmp"
  # shellcheck disable=SC2046
  (cd "$tools/$g" && go build -v -p "$jobs" -o "$tmp/" -tags "$(group_tags "$g")" \
    -ldflags "$(group_ldflags "$g")" $(group_packages "$g")) 2>&1 | progress "$g"
  # go names a binary built from a path ending in /v3 after the element before it.
  if [[ $g == etcd && ! -e "$tmp/etcd" ]]; then mv "$tmp/server" "$tmp/etcd"; fi
  if [[ $g == prometheus-operator ]]; then mv "$tmp/operator" "$tmp/prometheus-operator"; fi
  for b in $(group_binaries "$g"); do
    [[ -x "$tmp/$b" ]] || { echo "build-binaries: $g did not yield $b" >&2; exit 1; }
  done
  touch "$tmp/.complete"
  # The store keeps one build a group: older versions of it are hundreds of MB each.
  rm -rf "$store/$g-"*
  mv "$tmp" "$out"
  install_from "$out" "$g" "$key"
  echo "build-binaries: built $g in $((SECONDS - start)) s"
}

quiet=0 check=0
case "${1:-}" in
  -q) quiet=1; shift ;;
  --check) check=1; shift ;;
esac
groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=("${all_groups[@]}")
for g in "${groups[@]}"; do group_binaries "$g" >/dev/null; done
if [[ $check == 1 ]]; then
  for g in "${groups[@]}"; do
    key="$(group_key "$g")"
    [[ -f "$bin_dir/.$g.key" && "$(cat "$bin_dir/.$g.key")" == "$key" ]] \
      || [[ -f "$store/$g-$key/.complete" ]] || exit 1
  done
  exit 0
fi
# One build at a time on a machine: a second run (another checkout, a parallel test session)
# waits, then finds the store filled.
mkdir -p "$store"
exec 9>"$store/.lock"
flock -n 9 || { echo "build-binaries: waiting for another build to finish"; flock 9; }
start_all=$SECONDS
built=0
for g in "${groups[@]}"; do build_group "$g"; done
if [[ $quiet == 0 || $built == 1 ]]; then
  echo "build-binaries: done in $((SECONDS - start_all)) s; binaries in $bin_dir"
fi
