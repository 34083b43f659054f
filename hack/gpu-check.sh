#!/usr/bin/env bash
# On a CUDA machine (the device tool): build nothing; serve one streamed chat completion with the
# default settings (serve-smoke), run the CUDA tests, the roofline check of
# the simulated SKUs (8B/1B shapes), where the plain step's time goes (step_profile), paged
# attention in place against today's gather (attention_bench), then the engine benchmark and
# real batch sweeps of the tiny pair, and print a short table. Needs the tiny pair and the
# wheels carried over (run with carry [".cache/models", ".whl"]). Without this project's venv
# (the device image has torch but not the rest), it installs the wheels carried in .whl
# (`hack/gpu-check.sh --wheels` downloads them here) and imports the package from the tree.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing_extensions==4.16.0 kubernetes==37.0.2 durationpy==0.11 oauthlib==4.0.1
  requests-oauthlib==2.0.0 websocket-client==1.9.2 aiohttp-retry==2.9.1
  # the server and the official client, for serve-smoke
  fastapi==0.165.0 starlette==1.10.0 annotated-doc==0.0.7 opentelemetry-api==1.45.3
  uvicorn==0.55.0 click==8.5.1 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 idna==3.21
  prometheus_client==0.26.0 httpx==0.29.0 httpcore==1.0.9 certifi==2026.10.19.post1
  openai==3.63.0 jiter==0.19.0 httpx2==2.17.0 httpcore2==2.17.0 truststore==0.10.5)
if [[ "${1:-}" == --wheels ]]; then
  exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
fi
out=${OUT:-.cache/gpu-check}
mkdir -p "$out"
if [[ -x .venv/bin/python ]]; then
  py=.venv/bin/python
else
  py=python3
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  mkdir -p /tmp/src/spectune
  ln -sfn "$PWD/engine" /tmp/src/spectune/engine
  ln -sfn "$PWD/operator" /tmp/src/spectune/operator
  export PYTHONPATH="/tmp/site:/tmp/src"  # not the tree: its operator/ would hide the stdlib's
fi
export PYTHONUNBUFFERED=1
results=()
only=" $* "  # hack/gpu-check.sh [STEP...]: only those steps (default all)
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep going, remember the outcome
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  [[ "$only" == "  " || "$only" == *" $name "* ]] || return 0
  echo "=== $name"
  timeout "$limit" "$@" 2>&1 | tee -a "$out/gpu-check.log"
  rc=${PIPESTATUS[0]}
  results+=("$(printf '%-14s rc %-3s %4ss' "$name" "$rc" $((SECONDS - start)))")
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
"$py" -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
command -v gcc cc || echo "no C compiler (torch.compile's Triton launcher needs one)"
# First: what a user's first GPU pod does, the server with the default settings and one
# streamed chat completion through the openai client (startup to Ready, first request).
step serve-smoke 660 "$py" benchmarks/serve_smoke.py --device cuda --json "$out/serve-smoke.json"
batches=${BATCHES:-1,4,16,64,128,256}  # each shape compiles FlexAttention once (~3 s on the H200's host)
step roofline 100 "$py" benchmarks/roofline_check.py --sku H200 --batches $batches \
  --json "$out/roofline.json"
step cuda-tests 150 "$py" -m pytest -q tests/engine/test_cuda.py tests/engine/test_simulated_device.py -p no:cacheprovider
step roofline-compiled 90 "$py" benchmarks/roofline_check.py --sku H200 --batches $batches \
  --compile --json "$out/roofline-compiled.json"
step roofline-gather 60 "$py" benchmarks/roofline_check.py --sku H200 --batches $batches \
  --attention gather --json "$out/roofline-gather.json"
step step-profile-compiled 40 "$py" benchmarks/step_profile.py --compile
step step-profile 40 "$py" benchmarks/step_profile.py --attention gather
step attention 120 "$py" benchmarks/attention_bench.py
step engine-bench 80 "$py" benchmarks/engine_bench.py --device cuda --size tiny --repeats 3
for method in draft ngram; do
  [[ "$only" == "  " || "$only" == *" sweep-$method "* ]] || continue
  step "sweep-$method" 40 "$py" -m spectune.engine.cli bench --device cuda --sweep batch \
    --method "$method" --batch-sizes 1,2,4,8,16,32,64,128,256 --stop-after 0 --out "/tmp/sweep-$method"
  cp "/tmp/sweep-$method/bench.json" "$out/sweep-$method.json"
done
echo "=== summary"
printf '%s\n' "${results[@]}"
