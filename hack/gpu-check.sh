#!/usr/bin/env bash
# On a CUDA machine (the device tool): build nothing, run the CUDA tests and the GPU
# benchmark, print a short table. Needs the venv and the tiny/bench models carried over.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$bin/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
"$bin/pytest" -q -m gpu tests/engine/test_cuda.py -p no:cacheprovider
"$bin/python" benchmarks/engine_bench.py --device cuda --size "${SIZE:-bench}" --repeats "${REPEATS:-3}"
