#!/usr/bin/env bash
# `make test`: every test, in two lanes at once. The cluster lane (tests that need the local
# cluster or a Go-built tool, one at a time as before) spends most of its time waiting on
# calibration windows and scrapes; the other lane (make check's tests and the slow ones that
# need neither) runs beside it at nice 10, so the engines behind the cluster's pods keep their
# modelled clocks. Arguments go to both pytest runs. The cluster lane prints as it runs, the
# other lane's output follows it; the exit status is non-zero when either lane failed (a lane
# that arguments leave without tests, pytest's exit 5, has not failed).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=.venv/bin/pytest
beside="$(mktemp -t spectune-test-beside.XXXXXX)"
trap 'rm -f "$beside"' EXIT

echo "test: the lane beside the cluster (not cluster, not tools) runs at nice 10; its output follows the cluster lane's"
nice -n 10 "$pytest" -p no:cacheprovider -m "not cluster and not tools" "$@" >"$beside" 2>&1 &
other=$!

"$pytest" -m "cluster or tools" "$@"
cluster=$?
wait "$other"
besides=$?

echo
echo "=== the lane beside the cluster: not cluster, not tools (exit $besides) ==="
cat "$beside"
echo
echo "test: cluster lane exit $cluster, the lane beside it exit $besides"
ok() { (($1 == 0 || $1 == 5)); }
ok "$cluster" && ok "$besides"
