#!/usr/bin/env bash
# The demo until the bench and the operator land: one prompt through the engine plain,
# with the distilled draft model and with n-gram prompt lookup. Greedy speculation is
# lossless, so all three texts must be identical; the table shows what speculation bought.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
out=.cache/demo
mkdir -p "$out"
prompt=$'class Stack:\n    """A last-in first-out stack."""\n\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n'
for method in none draft ngram; do
  args=(--model tiny-target --prompt "$prompt" --max-tokens 192 --device cpu --json)
  if [ "$method" = draft ]; then args+=(--draft tiny-draft); else args+=(--method "$method"); fi
  "$bin/spectune-engine" generate "${args[@]}" > "$out/$method.json"
done
"$bin/python" - "$out" <<'PY'
import json, pathlib, sys
runs = {m: json.loads((pathlib.Path(sys.argv[1]) / f"{m}.json").read_text()) for m in ("none", "draft", "ngram")}
base = runs["none"]["tokens_per_second"]
print(runs["none"]["text"])
print(f"\n{'method':<8}{'tokens':>8}{'tok/s':>10}{'speedup':>9}{'acceptance':>12}{'tokens/iter':>13}")
for m, r in runs.items():
    acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
    per = "1.00" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
    print(f"{m:<8}{r['completion_tokens']:>8}{r['tokens_per_second']:>10.1f}"
          f"{r['tokens_per_second'] / base:>8.2f}x{acc:>12}{per:>13}")
same = len({r["text"] for r in runs.values()}) == 1
print("\ngreedy outputs identical across methods:", "yes" if same else "NO")
sys.exit(0 if same else 1)
PY
