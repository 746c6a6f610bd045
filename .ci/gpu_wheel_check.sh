#!/usr/bin/env bash
# On a GPU machine, from the repository root: the wheel built on the CPU machine (which has nvcc)
# runs here on its prebuilt CUDA module, with no JIT build.
#
#   here (CPU machine):  CUDA_HOME=/usr/local/cuda pip wheel --no-deps -w .whl .
#                        plus the wheels this Python lacks there (apache-tvm-ffi for cp312, ...)
#   there (GPU machine): bash .ci/gpu_wheel_check.sh [pytest args]   (default: -q -m cuda)
#
# Installs .whl/*.whl into /tmp/site, unsets CUDA_HOME/CUDA_PATH, drops the toolkit from PATH, and
# gives the JIT cache an empty folder; then, from outside the checkout: `ffi-dsa info`, the first
# CUDA call's time (module load + first launch), the test suite against the installed package, and
# a check that the JIT cache is still empty (a JIT build would have written there).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
ls .whl/ffi_dsa-*.whl >/dev/null 2>&1 || { echo "no .whl/ffi_dsa-*.whl: build the wheel first"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "installing .whl/*.whl failed"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
unset CUDA_HOME CUDA_PATH
PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
export PATH
FFI_DSA_CACHE_DIR=$(mktemp -d /tmp/ffi_dsa_empty_cache.XXXXXX)
export FFI_DSA_CACHE_DIR
cd "$(mktemp -d)" || exit 1
echo "nvcc on PATH: $(command -v nvcc || echo none); CUDA_HOME unset; JIT cache $FFI_DSA_CACHE_DIR"

rc=0
python3 -m ffi_dsa info || rc=1
python3 - <<'PY' || rc=1
import time
start = time.perf_counter()
import torch
import ffi_dsa
from ffi_dsa.contract import DEFAULT_TOPK
from ffi_dsa.workloads import make_batch
args = make_batch([8192, 3000], seed=1).to_torch("cuda")
out = torch.empty((2, DEFAULT_TOPK), dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
ready = time.perf_counter()
ffi_dsa.call(*args, out)
torch.cuda.synchronize()
first = time.perf_counter()
ffi_dsa.call(*args, out)
torch.cuda.synchronize()
print(f"import + inputs {ready - start:.2f} s; first CUDA call {first - ready:.3f} s "
      f"(module load + launch); second {1e3 * (time.perf_counter() - first):.2f} ms")
assert ffi_dsa.check_topk(out, *[a.cpu() for a in args]) == []
PY
[ $# -gt 0 ] || set -- -q -m cuda
python3 -m pytest -p no:cacheprovider "$@" "$ROOT/tests" || rc=1
if [ -n "$(ls -A "$FFI_DSA_CACHE_DIR")" ]; then
  echo "a JIT build happened (the JIT cache is not empty): $(ls "$FFI_DSA_CACHE_DIR")"; rc=1
else
  echo "no JIT build: the prebuilt CUDA module served every call"
fi
exit $rc
