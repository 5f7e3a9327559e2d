#!/usr/bin/env bash
# The GPU check, one command, from the repository root of a copy that is not installed:
#   OUT=/some/folder bash benchmarks/gpu_check.sh      (add --smoke to check the script on any machine)
# Needs python with jax[cuda], flax, optax, torch (CUDA), timm, safetensors; transformers is optional
# (the hf contender is reported as an error without it). No network. Finishes in under 8 minutes on
# one H200: the Python side stops starting benchmark groups after --budget-s and `timeout` is the
# backstop; everything measured so far is already under $OUT. See benchmarks/gpu_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX and torch share the GPU: no 75% up-front grab
export TF_CPP_MIN_LOG_LEVEL=1
PY="${PYTHON:-python3}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c 'import jax, torch; print(jax.__version__, jax.devices(), torch.__version__, torch.cuda.is_available())' 2>&1
} | tee "$OUT/env.txt"
timeout 470 "$PY" -m benchmarks.gpu_check --out "$OUT" --budget-s 400 "$@" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
