#!/usr/bin/env bash
# `make demo`: the operator moving speculation thresholds on the local cluster as the fleet and
# the traffic change (demo/run.py; report in .cache/demo/). `make demo-down`
# (this script with `down`) stops what it left running: its operator, the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == down ]]; then
  for pidfile in .local/run/demo-*.pid; do
    [[ -f "$pidfile" ]] || continue
    pid="$(cat "$pidfile")"
    # each was started in a session of its own: its pid is its process group
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  exec hack/cluster.sh down
fi
exec .venv/bin/python -m spectune.demo.run "$@"
