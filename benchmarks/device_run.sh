#!/usr/bin/env bash
# The one script a GPU call runs, from the repository root of the device machine:
#
#   bash benchmarks/device_run.sh [build|smoke|test|sanitize|bench|options|queries|counters|fuzz|ab|
#                                  timeline|chain|prefill|sharded|all]...                     (default: all)
#
#   build     import ffi_dsa, force the CUDA module build, print ptxas resource usage (-Xptxas -v)
#             of each arch's translation units (cuda/csrc/sm_*/)
#   smoke     benchmarks/gpu_smoke.py: each path once, each in a process of its own under a time
#             limit (SMOKE_TIMEOUT, default 90 s), checked against the reference; a case that
#             hangs or fails stops the run here: every later step would meet the same kernel
#                                                                -> $OUT/smoke.log
#   test      python3 -m pytest $PYTEST_ARGS as TEST_PROCESSES processes at once (default: one a CPU
#             core), the k-th running --part k/TEST_PROCESSES (tests/conftest.py), each with
#             TEST_THREADS BLAS/OpenMP threads (default 1): the suite's time is the CPU's (float64
#             references, batches), whose small products a thread pool slows down (a reference of
#             132 x 6K tokens: 0.83 s of CPU on one thread, 1.77 s on two), so the parts share the
#             GPU well (the 9 CUDA-heavy files' 402 tests: 104 in 230 s in 8 parts of ~2 threads)
#                                                                -> $OUT/pytest.log (every part's summary
#                                                                   and failures; whole logs in /tmp)
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck over benchmarks/sanitize_cases.py
#                                                                -> $OUT/sanitize.log
#   bench     benchmarks/bench_gpu.py                            -> $OUT/bench.{log,json,png}
#   options   what decode's options cost: bench_gpu.py --workloads serving,wide --ids slots,positions
#             (positions beside slots on both paths; wide tables with and without max_seq_len)
#                                                                -> $OUT/options.{log,json}
#   queries   benchmarks/bench_queries.py (N queries per row, 32 heads) -> $OUT/queries.{log,json}
#   counters  benchmarks/kernel_counters.py, N = 1 then N = 2      -> $OUT/counters.log
#   fuzz      benchmarks/fuzz.py ${FUZZ_ARGS:---device cuda --calls 10000}  -> $OUT/fuzz.log
#   ab        benchmarks/ab_modules.py against another tree's module, both in one process: AB_AGAINST
#             (default .main, a copy of main's tree: `git archive main | tar -x -C .main`, named in
#             the call's carry), AB_WORKLOADS (default W1,W2,W3,W4,W5,W6), for each N of AB_QUERIES
#             (default "1 2 4"); the other module is built in /tmp/ffi_dsa_cache_against
#                                                                -> $OUT/ab.log
#   timeline  benchmarks/kernel_timeline.py ${TIMELINE_ARGS:-W1,W2,W3,W4,W5,W6} (add --queries N,
#             --rows, --select-threads 512, --floor)              -> $OUT/timeline.log
#   sharded   several GPUs: their tests, bench_sharded_jax, bench_jax_processes (one process per GPU,
#             jax.distributed) and bench_torch_ranks -> $OUT/sharded_*
#   chain     the production chain side by side (.chain/run.sh ${CHAIN_ARGS:---mtp}; carry .chain,
#             a copy of ../shared/chain)                          -> $OUT/chain.log
#   prefill   benchmarks/bench_prefill.py, then the chain's prefill table if .chain is carried
#                                                                -> $OUT/prefill.log
#
# The device image has python3 3.12, torch (CUDA), JAX, nvcc at /usr/local/cuda and ninja, but not
# apache-tvm-ffi / jax-tvm-ffi: those travel as cp312 wheels in .whl/ (name .whl in the call's
# carry). A failing step does not stop the next one; the exit code is non-zero if any failed.
# Knobs (environment): BENCH_ARGS (extra bench_gpu.py options, e.g. "--workloads W1,W5"), OPTIONS_ARGS
# (extra options of the options step),
# QUERIES_ARGS (extra bench_queries.py options), PREFILL_ARGS (extra bench_prefill.py options),
# COUNTERS_WORKLOADS (default W1,W2,W3,W4,W5,W6), JAX_PROCESSES (process counts of bench_jax_processes,
# default 1,2) and JAX_PROCESSES_ARGS (its extra options),
# PYTEST_ARGS (default "-q -x tests"; e.g. "-q -m cuda tests" for the GPU's tests alone), TEST_PROCESSES
# (default: the CPU cores), TEST_THREADS (default 1), TEST_TIMEOUT (seconds a part may run, default
# 900; exit 124 past it), TEST_STACK_AFTER
# (seconds one test runs before its stack is printed, default 120), SMOKE_TIMEOUT (seconds a smoke
# case may run, default 90), SANITIZE_TOOLS (default "memcheck racecheck synccheck initcheck"),
# SANITIZE_TIMEOUT (seconds per tool, default 150), FFI_DSA_CACHE_DIR (default /tmp/ffi_dsa_cache).
set -u
cd "$(dirname "$0")/.." || exit 1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_run: installing the carried wheels in .whl/ failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  echo "device_run: no .whl/*.whl carried (name .whl in carry); using whatever tvm_ffi is installed"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

export PYTHONUNBUFFERED=1
export FFI_DSA_CACHE_DIR=${FFI_DSA_CACHE_DIR:-/tmp/ffi_dsa_cache}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH=$CUDA_HOME/bin:$PATH
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX tests must not take 75% of the GPU up front
export OUT=${OUT:-$PWD/.device_out}
mkdir -p "$OUT" "$FFI_DSA_CACHE_DIR"

python3 -c "import tvm_ffi" 2>/dev/null || { echo "device_run: tvm_ffi is not importable; carry its wheel in .whl/"; exit 1; }

FAILED=()
SUMMARY=()

header() { printf '\n==================== %s ====================\n' "$*"; }

run_step() {  # run_step NAME FUNCTION
  local name=$1 fn=$2 start rc ms took
  header "$name"
  start=$(date +%s%N)
  "$fn"
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  took=$(printf '%d.%d' $((ms / 1000)) $(((ms % 1000) / 100)))
  if [ "$rc" -eq 0 ]; then
    SUMMARY+=("$(printf '%-9s OK      %7s s' "$name" "$took")")
  else
    SUMMARY+=("$(printf '%-9s FAILED  %7s s  (exit %s)' "$name" "$took" "$rc")")
    FAILED+=("$name")
  fi
  printf -- '---- %s: %s in %s s ----\n' "$name" "$([ "$rc" -eq 0 ] && echo OK || echo "FAILED (exit $rc)")" "$took"
  return "$rc"
}

env_info() {
  header "environment"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -4
  python3 - <<'EOF'
import sys
import tvm_ffi
print(f"python {sys.version.split()[0]}, tvm_ffi {tvm_ffi.__version__}", end="")
try:
    import torch
    print(f", torch {torch.__version__} (CUDA {torch.version.cuda}, available={torch.cuda.is_available()})")
except Exception as exc:  # noqa: BLE001
    print(f", torch not importable: {exc}")
EOF
  "$CUDA_HOME/bin/nvcc" --version 2>&1 | tail -2 | head -1
  echo "OUT=$OUT FFI_DSA_CACHE_DIR=$FFI_DSA_CACHE_DIR CUDA_HOME=$CUDA_HOME"
}

step_build() {
  local tvm_inc dl_inc rc src pids=()
  tvm_inc=$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())')
  dl_inc=$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_dlpack_include_path())')
  # ptxas resource usage of every arch's translation units (cuda/csrc/sm_*/), compiled beside the
  # package's own build (same flags, that arch's -gencode, plus -Xptxas -v), in parallel
  : >"$OUT/build.log"
  for src in cuda/csrc/sm_*/*.cu; do
    arch=$(basename "$(dirname "$src")")
    ( "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -lineinfo "-gencode=arch=compute_${arch#sm_},code=$arch" -Xptxas -v \
        -c -o /dev/null "$src" \
        -I cuda/include -I "$tvm_inc" -I "$dl_inc" >"$OUT/build_${arch}_$(basename "$src").log" 2>&1
      echo "nvcc $src exit $?" >>"$OUT/build_${arch}_$(basename "$src").log" ) &
    pids+=($!)
  done
  python3 - <<'EOF'
import time
start = time.perf_counter()
import ffi_dsa
from ffi_dsa import _build, _ffi_api
print(f"ffi_dsa imported from {ffi_dsa.__file__}")
print(f"CPU module:  {_build.cpu_library()}")
_ffi_api.cpu_module()
print(f"CUDA module: {_build.cuda_library()}")
_ffi_api.cuda_module()
print(f"both modules load ({time.perf_counter() - start:.1f} s)")
EOF
  rc=$?
  wait "${pids[@]}"
  cat "$OUT"/build_*.cu.log >>"$OUT/build.log" && rm -f "$OUT"/build_*.cu.log
  echo "---- ptxas resource usage (nvcc -Xptxas -v, full log in \$OUT/build.log) ----"
  local filt=cat
  command -v c++filt >/dev/null 2>&1 && filt=c++filt
  grep -E "Compiling entry|Used [0-9]+ registers|spill|nvcc .* exit|error" "$OUT/build.log" \
    | sed -E "s/Compiling entry function '([^']+)'.*/kernel \1/" | $filt | head -60
  if grep -E "nvcc .* exit [1-9]" "$OUT/build.log"; then rc=1; fi
  return $rc
}

step_smoke() {
  set -o pipefail
  python3 benchmarks/gpu_smoke.py --timeout "${SMOKE_TIMEOUT:-90}" 2>&1 | tee "$OUT/smoke.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_test() {  # the suite in TEST_PROCESSES interleaved parts at once; fails if any part fails or none ran a test
  local n=${TEST_PROCESSES:-$(nproc)} threads=${TEST_THREADS:-1} k rc=0 one ran=0 pids=() logs=()
  python3 -c "import pytest" 2>/dev/null || { echo "test: pytest is not importable here (carry its wheels in .whl/)"; return 1; }
  : >"$OUT/pytest.log"
  for k in $(seq 1 "$n"); do
    logs+=("$(mktemp /tmp/pytest_part_${k}_of_${n}.XXXX.log)")
    # a test still running after TEST_STACK_AFTER s prints every thread's stack (pytest's
    # faulthandler_timeout), and a part still running after TEST_TIMEOUT s is stopped: a hung kernel
    # costs the step that long, not the call
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads \
      timeout -k 10 "${TEST_TIMEOUT:-900}" python3 -m pytest ${PYTEST_ARGS:--q -x tests} --part "$k/$n" --durations=5 \
        -o faulthandler_timeout="${TEST_STACK_AFTER:-120}" >"${logs[-1]}" 2>&1 &
    pids+=($!)
  done
  for k in $(seq 1 "$n"); do
    wait "${pids[k-1]}"
    one=$?
    # exit 5: this part got no test (a short selection split in many parts)
    if [ "$one" -eq 0 ]; then ran=1; elif [ "$one" -ne 5 ]; then rc=1; fi
    { echo "===== part $k/$n (exit $one$([ "$one" -eq 124 ] && echo ": stopped after ${TEST_TIMEOUT:-900} s"), ${logs[k-1]}) ====="
      grep -E "^(FAILED|ERROR)|Error|passed|failed|skipped" "${logs[k-1]}" | tail -30
      grep -B1 -A8 "most recent call first" "${logs[k-1]}" | head -20; } | tee -a "$OUT/pytest.log"
  done
  if [ "$rc" -eq 0 ] && [ "$ran" -eq 0 ]; then echo "test: no part ran a test (pytest exit 5 in each): counted as a failure"; rc=1; fi
  return $rc
}

step_sanitize() {
  local tool rc=0 one sanitizer
  sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  [ -x "$sanitizer" ] || { echo "sanitize: compute-sanitizer not found"; return 1; }
  : >"$OUT/sanitize.log"
  # build (or load) the CUDA module outside the sanitizer: nvcc must not run under it
  python3 -c "from ffi_dsa import _ffi_api; _ffi_api.cuda_module()" || return 1
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    echo "-- compute-sanitizer --tool $tool"
    # PYTORCH_NO_CUDA_MEMORY_CACHING: exact allocations, so memcheck sees every out-of-bounds byte
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-150}" \
      "$sanitizer" --tool "$tool" --error-exitcode 99 python3 benchmarks/sanitize_cases.py \
      >"$OUT/sanitize_$tool.tmp" 2>&1
    one=$?
    { echo "===== $tool (exit $one) ====="; cat "$OUT/sanitize_$tool.tmp"; } >>"$OUT/sanitize.log"
    grep -E "sanitize case" "$OUT/sanitize_$tool.tmp" | head -40
    grep -E "SUMMARY" "$OUT/sanitize_$tool.tmp"
    [ "$one" -ne 0 ] && { echo "   first lines of the $tool report:"; grep -E "^=========" "$OUT/sanitize_$tool.tmp" | head -25; }
    rm -f "$OUT/sanitize_$tool.tmp"
    [ "$one" -eq 124 ] && echo "   $tool: timed out after ${SANITIZE_TIMEOUT:-150} s"
    echo "   $tool: exit $one"
    [ "$one" -ne 0 ] && rc=1
  done
  return $rc
}

step_bench() {
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/bench_gpu.py --json "$OUT/bench.json" --plot "$OUT/bench.png" ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench.log"
  local rc=$?
  set +o pipefail
  return $rc
}

# Decode's options in one table: ids="positions" timed beside slots on W1..W6 (W5 is the one-kernel
# path, the others the two-kernel path) and the wide tables W1w/W3w/W5w with (W*wh) and without
# max_seq_len against the same rows in narrow tables; the summary lines give the ratios.
step_options() {
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/bench_gpu.py --workloads serving,wide --ids slots,positions --no-naive --no-peers \
      --json "$OUT/options.json" ${OPTIONS_ARGS:-} 2>&1 | tee "$OUT/options.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_queries() {
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/bench_queries.py --json "$OUT/queries.json" ${QUERIES_ARGS:-} 2>&1 | tee "$OUT/queries.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_counters() {
  local rc=0 w=${COUNTERS_WORKLOADS:-W1,W2,W3,W4,W5,W6}
  : >"$OUT/counters.log"
  python3 benchmarks/kernel_counters.py "$w" 2>&1 | tee -a "$OUT/counters.log" || rc=1
  python3 benchmarks/kernel_counters.py "$w" --queries 2 2>&1 | tee -a "$OUT/counters.log" || rc=1
  return $rc
}

step_ab() {
  local against=${AB_AGAINST:-.main} n rc=0
  [ -d "$against/ffi_dsa" ] || { echo "ab: $against holds no ffi_dsa tree (carry a copy of main's tree)"; return 1; }
  : >"$OUT/ab.log"
  for n in ${AB_QUERIES:-1 2 4}; do
    local queries=()
    [ "$n" != 1 ] && queries=(--queries "$n")  # N = 1: the rank-3 q of one query per row
    python3 benchmarks/ab_modules.py --against "$against" --against-cache /tmp/ffi_dsa_cache_against \
      "${AB_WORKLOADS:-W1,W2,W3,W4,W5,W6}" "${queries[@]}" 2>&1 | tee -a "$OUT/ab.log"
    [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
  done
  return $rc
}

step_timeline() {
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/kernel_timeline.py ${TIMELINE_ARGS:-W1,W2,W3,W4,W5,W6} 2>&1 | tee "$OUT/timeline.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_fuzz() {
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/fuzz.py ${FUZZ_ARGS:---device cuda --calls 10000} 2>&1 | tee "$OUT/fuzz.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_chain() {
  [ -f .chain/run.sh ] || { echo "chain: .chain/run.sh missing (cp -r ../shared/chain .chain; carry .chain)"; return 1; }
  set -o pipefail
  # shellcheck disable=SC2086
  OUT="$OUT" bash .chain/run.sh ${CHAIN_ARGS:---mtp} 2>&1 | tee "$OUT/chain.log"
  local rc=$?
  set +o pipefail
  return $rc
}

step_prefill() {
  local rc=0
  set -o pipefail
  # shellcheck disable=SC2086
  python3 benchmarks/bench_prefill.py ${PREFILL_ARGS:-} 2>&1 | tee "$OUT/prefill.log" || rc=1
  if [ -f .chain/run.sh ]; then
    OUT="$OUT" bash .chain/run.sh --prefill 2>&1 | tee -a "$OUT/prefill.log" || rc=1
  fi
  set +o pipefail
  return $rc
}

# Several GPUs (a multi-GPU kind): the tests that need 2 or more GPUs, then the data-parallel
# tables of JAX (bench_sharded_jax, N = 1 and 2, and N = 1 with XLA's command buffers off), of JAX
# with one process per GPU under jax.distributed (bench_jax_processes, 1 and 2 processes, N = 1 and 2)
# and of torch with one process per GPU (bench_torch_ranks).
step_sharded() {
  local rc=0 gpus
  gpus=$(nvidia-smi -L | wc -l)
  echo "sharded: $gpus GPUs"
  set -o pipefail
  python3 -m pytest -q -rs tests/test_sharded_jax.py tests/test_sharded_torch.py tests/test_jax_processes.py \
      -k "gpu or rank" 2>&1 \
      | tail -15 | tee "$OUT/sharded_tests.log" || rc=1
  python3 -m pytest -q -rs tests/test_cuda.py -k "two_gpus or second_gpu" 2>&1 | tail -5 | tee -a "$OUT/sharded_tests.log" \
      || rc=1
  set +o pipefail
  for n in 1 2; do
    python3 benchmarks/bench_sharded_jax.py --platform gpu --queries $n \
        ${SHARDED_JAX_ARGS:-} --json "$OUT/sharded_jax_n$n.json" 2>&1 | grep -v Warning || rc=1
  done
  for n in 1 2; do
    python3 benchmarks/bench_jax_processes.py --platform gpu --processes ${JAX_PROCESSES:-1,2} \
        --queries $n ${JAX_PROCESSES_ARGS:-} --json "$OUT/sharded_jax_processes_n$n.json" 2>&1 || rc=1
  done
  XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/bench_sharded_jax.py --platform gpu \
      --split-batch 0 --timeline ${SHARDED_JAX_ARGS:-} --json "$OUT/sharded_jax_n1_no_command_buffers.json" 2>&1 \
      | grep -v Warning || rc=1
  python3 benchmarks/bench_torch_ranks.py --world-sizes 1,2,4 --queries 1,2 --fixed-batch 128 \
      ${SHARDED_TORCH_ARGS:-} --json "$OUT/sharded_torch.json" 2>&1 || rc=1
  return $rc
}

STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(all)
EXPANDED=()
for s in "${STEPS[@]}"; do
  case "$s" in
    all) EXPANDED+=(build smoke test sanitize bench) ;;
    build|smoke|test|sanitize|bench|options|queries|counters|fuzz|ab|timeline|chain|prefill|sharded) EXPANDED+=("$s") ;;
    *) echo "usage: bash benchmarks/device_run.sh [build|smoke|test|sanitize|bench|options|queries|counters|fuzz|ab|timeline|chain|prefill|sharded|all]..."
       exit 2 ;;
  esac
done

T0=$(date +%s)
env_info
for s in "${EXPANDED[@]}"; do
  if ! run_step "$s" "step_$s" && [ "$s" = smoke ]; then
    echo "smoke failed: the later steps are skipped (each would meet the same kernel)"
    break
  fi
done

header "summary ($(( $(date +%s) - T0 )) s)"
printf '%s\n' "${SUMMARY[@]}"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
echo "all steps passed"
