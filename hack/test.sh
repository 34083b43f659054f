#!/usr/bin/env bash
# `make test`: every test, in lanes at once against one local cluster (tests/support/lanes.py).
# - wiring: the cluster and tools tests but autotune's, one at a time;
# - autotune: the autotuner's two longest end-to-end modules (the three-SKU e2e and the
#   lifecycle), one test at a time, beside wiring (both spend most of their time waiting on
#   calibration windows and scrapes, and their operators watch only their own tests'
#   namespaces);
# - beside both, at nice 10, every test that needs neither the cluster nor a Go-built tool, so
#   that the engines behind the cluster's pods keep their modelled clocks;
# - then the cluster's restart test alone (it takes the cluster down and up), and the RBAC
#   evidence: the chart's rules against what the lanes' operators called (the audit log);
# - then the image tests (marker `images`): both images built with podman (hack/images.sh) and
#   run, the operator's against the cluster; alone, since a build takes both cores.
# The cluster comes up first when a lane needs it and is not up (and goes down at the end), so
# that the lanes share it. Arguments go to every pytest run. The wiring lane prints as it runs,
# the others' output follows; the exit status is non-zero when a lane failed (a lane that
# arguments leave without tests, pytest's exit 5, has not failed).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
out="$(mktemp -d -t spectune-test.XXXXXX)"
trap 'rm -rf "$out"' EXIT
cluster_tests=(-m "(cluster or tools) and not images")

needs_cluster() {
  (($# == 0)) || "$pytest" -p no:cacheprovider -q --collect-only -m cluster "$@" >/dev/null 2>&1
}
started=0
if needs_cluster "$@" && ! hack/cluster.sh status >/dev/null 2>&1; then
  if ! command -v go >/dev/null && [[ ! -x .local/bin/kube-apiserver ]]; then
    echo "test: the local cluster's binaries are not in .local/bin and Go is not installed to" \
      "build them: run .ci/run (it installs Go), or install Go and run \`make binaries\`" >&2
    exit 1
  fi
  hack/cluster.sh up || { echo "test: the local cluster did not come up (above)" >&2; exit 1; }
  started=1
fi

# The RBAC evidence test (restart lane) reads what the operators called from here on.
SPECTUNE_TESTS_SINCE="$(date -u +%Y-%m-%dT%H:%M:%S+00:00)"
export SPECTUNE_TESTS_SINCE
echo "test: lanes at once: wiring (below), autotune and, at nice 10, the tests that need no cluster (their output follows)"
nice -n 10 "$pytest" -p no:cacheprovider -m "not cluster and not tools and not images" "$@" \
  >"$out/beside" 2>&1 &
beside=$!
"$pytest" -p no:cacheprovider "${cluster_tests[@]}" --lane autotune "$@" >"$out/autotune" 2>&1 &
autotune=$!
"$pytest" "${cluster_tests[@]}" --lane wiring "$@"
status=(wiring $?)
wait "$autotune"
status+=(autotune $?)
wait "$beside"
status+=(beside $?)

for lane in autotune beside; do
  echo
  echo "=== the $lane lane ==="
  cat "$out/$lane"
done
echo
echo "=== the restart lane, after the others ==="
"$pytest" -p no:cacheprovider "${cluster_tests[@]}" --lane restart "$@"
status+=(restart $?)
echo
echo "=== the image tests, last ==="
"$pytest" -p no:cacheprovider -m images "$@"
status+=(images $?)
((started)) && hack/cluster.sh down >/dev/null

echo
echo "test: exit status by lane: ${status[*]}"
failed=0
for ((i = 1; i < ${#status[@]}; i += 2)); do
  ((status[i] == 0 || status[i] == 5)) || failed=1
done
exit "$failed"
