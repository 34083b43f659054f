#!/usr/bin/env bash
# `make bench-demo`: `spectune-engine bench` on the tiny models on the CPU (the engine's story).
#  1. tiny-target + tiny-draft: speedup of speculation at each batch size, and where it stops
#     paying (the crossover) on this machine.
#  2. tiny-target + n-gram prompt lookup (fewer accepted tokens per step, so the crossover
#     comes at a batch a CPU reaches): the crossover, the recommended threshold, and goodput
#     under load when never speculating, always speculating, and gated at the threshold.
# Reports (bench.md, bench.json, speedup.png, goodput.png) go to .cache/bench-demo/{draft,ngram}/.
# Extra arguments are passed on to both runs (see README, "Bench").
set -euo pipefail
cd "$(dirname "$0")/.."
bench=(.venv/bin/spectune-engine bench --model tiny-target --device cpu
  --batch-sizes 1,2,4,8,16,32,64,128 --output-tokens uniform:32-96)
echo "== 1/2 tiny-target + tiny-draft: where does speculation stop paying?"
"${bench[@]}" --draft tiny-draft --sweep batch --out .cache/bench-demo/draft "$@"
echo
echo "== 2/2 tiny-target + n-gram lookup: crossover, threshold, goodput of never/always/gated"
"${bench[@]}" --method ngram --concurrency 1,4,16,64 --requests 100000 --duration-s 12 --rounds 6 \
  --out .cache/bench-demo/ngram "$@"
