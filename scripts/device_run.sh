#!/usr/bin/env bash
# The one command to run on the GPU device machine, from the repo root, with $OUT set:
#
#   bash scripts/device_run.sh [STEP ...]   (carry: build and .whl)
#
# With no STEP every step runs, else the set-up steps and the named ones, e.g.
#   bash scripts/device_run.sh smoke gpu_tests benchmark sass
# Steps: smoke gpu_tests sweep demo benchmark timelines kernel_times integration sanitizers
# profile profile_hopper sass, and not in the default set: compare (build/ against the
# build folder $BASELINE, scripts/compare_builds.py, output in compare.log), decode_rungs
# (the skinny-product rungs side by side), model_benchmark (the run of record of
# scripts/model_benchmark.py) and tp_benchmark (scripts/tp_benchmark.py under torchrun on
# 2 GPUs; with fewer visible it says so and passes; <date>-tp-benchmark.md/.json), profile_decode
# (Nsight Compute on cuBLAS and wgmma_streamk at 1 x 4096 x 4096, ncu_decode.txt), crash_search
# (scripts/crash_search.py: which rung or order fails at a shape; CU124=1 for that variant) and cu124
# (the CUDA 12.4 variant's GPU tests and benchmarks beside cu130's; needs `make variants`).
# Environment: BENCH_ARGS, SWEEP_ARGS, COMPARE_ARGS, TP_ARGS (extra arguments), SWEEP_SECONDS (the
# sweep's time budget), SANITIZE_RUNGS (rungs for the sanitizers; default all), SANITIZE_TOOLS
# (default: memcheck racecheck), DECODE_ARGS, PROFILE_SHAPE, PROFILE_RUNGS, BASELINE,
# GPU_TESTS (the test files or folders of gpu_tests; default tests).
#
# Steps: install the carried wheels (.whl/, if present), print the GPU, check that the
# prebuilt variant in build/ loads under the device's torch, run the GPU tests, the
# correctness sweep and the demo. Every step runs even if an earlier one failed; the
# script exits non-zero if any failed. What it leaves in $OUT (8 files, no folders;
# the device allows at most 8):
#   device.log (tests, sweep, demo, benchmark, timelines output)  sanitizer.log  ncu.txt
#   <date>-correctness.json/.md (summaries)  <date>-demo.md  <date>-benchmark.json/.md/.png
#   integration.md  (ncu_hopper.txt with profile_hopper): more than 8 when every step
#   runs, so point $OUT at a scratch folder and pack it (tar) into the real one.
# Copy them back yourself: the device's copy of the repo is discarded.
set -euo pipefail

cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# A Python step that runs past its limit gets SIGABRT (timeout -s ABRT), on which
# faulthandler prints every thread's stack: a stalled step says where it stood.
export PYTHONFAULTHANDLER=1
PY=${PY:-python3}
START=$SECONDS
FAILED=()

# run_step NAME COMMAND...: run one step, note its failure, never stop the script.
run_step() {
  local name=$1
  shift
  echo
  echo "=== $name ($((SECONDS - START)) s in)"
  if "$@"; then
    echo "=== $name: ok"
  else
    local rc=$?
    echo "=== $name: FAILED (exit $rc)"
    FAILED+=("$name")
  fi
}

install_wheels() {
  # The device has no `kernels` package: install the carried wheels into /tmp/site.
  [ -d .whl ] || { echo "no .whl/ folder: using the device's own packages"; return 0; }
  # Not the CUDA 12 runtime: its `nvidia` package would hide torch's own nvidia.* packages
  # (the cu124 step unpacks it where only LD_LIBRARY_PATH points).
  local wheels=()
  for wheel in .whl/*.whl; do
    case $wheel in .whl/nvidia_cuda_runtime_cu12-*) ;; *) wheels+=("$wheel") ;; esac
  done
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${wheels[@]}"
}

gpu_info() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
}

check_variant() {
  "$PY" - <<'EOF'
import sys
from pathlib import Path

import torch
from kernels import get_local_kernel

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPU: {torch.cuda.get_device_name()}")
variants = sorted(Path("build").glob("torch-*"))
print("variants in build/:", [v.name for v in variants])
pm = get_local_kernel(Path("build"))
print("loaded:", pm.__name__, "from", Path(pm.__file__).parent.name)
for name, info in pm.available_kernels().items():
    print(f"  {name}: {'runs here' if info.available else info.reason}")
sys.exit(0 if any(i.available for i in pm.available_kernels().values()) else 1)
EOF
}

gpu_tests() {
  # The integration models' tests need transformers and diffusers (fetch_device_wheels.sh
  # fetches their wheels); where .whl/ holds only what loads the build, that module is left
  # out, and the log says so, rather than failing the step on its import.
  local leave_out=()
  if ! "$PY" -c "import diffusers, transformers" 2>/dev/null; then
    echo "transformers / diffusers not installed: tests/test_integration_models.py left out" \
      "(carry the wheels of scripts/fetch_device_wheels.sh to run it)" | tee -a "$OUT/device.log"
    leave_out=(--ignore=tests/test_integration_models.py)
  fi
  # --continue-on-collection-errors: a CPU-only test module that cannot be imported here
  # (say, for a package the device lacks) is reported, but the GPU tests still run.
  # shellcheck disable=SC2086  # GPU_TESTS: a list of paths
  timeout -s ABRT -k 5 420 "$PY" -m pytest -m gpu ${GPU_TESTS:-tests} -q -ra -p no:cacheprovider --continue-on-collection-errors \
    "${leave_out[@]}" 2>&1 | tee -a "$OUT/device.log"
}

sweep() {
  timeout -s ABRT -k 5 250 "$PY" scripts/correctness_sweep.py --out "$OUT" --fuzz 500 --time-limit ${SWEEP_SECONDS:-210} ${SWEEP_ARGS:-} 2>&1 | tee -a "$OUT/device.log"
}

demo() {
  timeout 60 "$PY" scripts/demo.py --record --results-dir "$OUT" 2>&1 | tee -a "$OUT/device.log"
}

benchmark() {
  # shellcheck disable=SC2086  # BENCH_ARGS: extra arguments, word-split on purpose
  timeout -s ABRT -k 5 300 "$PY" scripts/benchmark_table.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/device.log"
}

# build/ against the build folder $BASELINE (another commit's build, carried along), in one
# process, interleaved: the ratio of their times per rung and shape (scripts/compare_builds.py).
compare() {
  : "${BASELINE:?set BASELINE to the build folder of the baseline}"
  # shellcheck disable=SC2086  # COMPARE_ARGS: extra arguments, word-split on purpose
  timeout -s ABRT -k 5 300 "$PY" scripts/compare_builds.py "$BASELINE" --candidates build ${COMPARE_ARGS:-} 2>&1 |
    tee "$OUT/compare.log"
}

# splitk, wgmma_streamk (its default cut, and cluster_size=1: the stream-K cut without
# clusters) and wgmma_persistent side by side on the Llama-3 projections at
# decode M and the first prefill Ms, eager and in CUDA graphs: what kernel="auto"'s token
# limits for the skinny rungs rest on (torch-ext/rungs.h).
decode_rungs() {
  # shellcheck disable=SC2086  # DECODE_ARGS: extra arguments (later ones win), word-split on purpose
  timeout -s ABRT -k 5 480 "$PY" scripts/model_benchmark.py --parts shapes --kernels splitk wgmma_streamk \
    wgmma_streamk:cluster_size=1 wgmma_persistent \
    --ms 1 2 4 8 16 32 64 128 256 512 1024 --rounds 2 --out "$OUT" --tag decode-rungs ${DECODE_ARGS:-} 2>&1 |
    tee -a "$OUT/device.log"
}

# The run of record of scripts/model_benchmark.py: host cost, the shape set, the model.
model_benchmark() {
  timeout -s ABRT -k 5 480 "$PY" scripts/model_benchmark.py --out "$OUT" 2>&1 | tee -a "$OUT/device.log"
}

# The Llama-3-8B-shaped model under transformers' tensor-parallel plan on 2 GPUs, every
# Linear kernelized on each rank (scripts/tp_benchmark.py): one process a GPU through
# torchrun, NVLink multicast off in NCCL, PyTorch and NVSHMEM.
tp_benchmark() {
  local gpus
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if [ "$gpus" -lt 2 ]; then
    echo "tp_benchmark: $gpus GPU(s) visible, it needs 2: not run" | tee -a "$OUT/device.log"
    return 0
  fi
  # shellcheck disable=SC2086  # TP_ARGS: extra arguments, word-split on purpose
  NCCL_NVLS_ENABLE=0 NCCL_CUMEM_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    timeout -k 10 540 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/tp_benchmark.py \
    --out "$OUT" ${TP_ARGS:-} 2>&1 | tee -a "$OUT/device.log"
}

# The CUDA 12.4 variant on this machine's CUDA 13 torch: loaded by path ($PM_VARIANT, as the
# kernels loader would not pick it for this torch), libcudart.so.12 from the carried
# nvidia-cuda-runtime-cu12 wheel. The GPU tests against it, then it and the cu130 variant,
# each in processes of its own (they share an op namespace, so they cannot load in one),
# through the benchmark at 4096^3 and 8192^3 and the model benchmark's shape set at decode
# M: <date>-variant-cu124/cu130-*.md, and side by side by their ratios to torch.matmul in
# <date>-variants.md/.json (scripts/compare_variants.py), the run of record.
cu124() {
  local machine cudart=/tmp/cudart12/nvidia/cuda_runtime/lib status=0 wheel
  machine=$(uname -m)
  wheel=$(ls .whl/nvidia_cuda_runtime_cu12-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || { echo "cu124: no nvidia-cuda-runtime-cu12 wheel in .whl/ (scripts/fetch_device_wheels.sh)"; return 1; }
  "$PY" -m zipfile -e "$wheel" /tmp/cudart12
  [ -d "build/torch-stable-abi210-cu124-$machine-linux" ] || {
    echo "cu124: no build/torch-stable-abi210-cu124-$machine-linux (make variants builds it)"; return 1; }
  # shellcheck disable=SC2086  # GPU_TESTS: test paths, word-split on purpose
  PM_VARIANT="torch-stable-abi210-cu124-$machine-linux" LD_LIBRARY_PATH="$cudart:${LD_LIBRARY_PATH:-}" \
    timeout -s ABRT -k 5 300 "$PY" -m pytest -q -m gpu ${GPU_TESTS:-tests} 2>&1 | tee -a "$OUT/device.log" || status=1
  for cuda in cu124 cu130; do
    export PM_VARIANT="torch-stable-abi210-$cuda-$machine-linux"
    LD_LIBRARY_PATH="$cudart:${LD_LIBRARY_PATH:-}" timeout -s ABRT -k 5 240 "$PY" scripts/benchmark_table.py --no-variants \
      --no-readme --shapes 4096x4096x4096 8192x8192x8192 --dtypes bfloat16 --rounds 5 --out "$OUT" \
      --tag "variant-$cuda-benchmark" 2>&1 | tee -a "$OUT/device.log" || status=1
    LD_LIBRARY_PATH="$cudart:${LD_LIBRARY_PATH:-}" timeout -s ABRT -k 5 240 "$PY" scripts/model_benchmark.py --parts shapes \
      --ms 1 2 4 8 16 32 64 128 256 --rounds 3 --out "$OUT" --tag "variant-$cuda-decode" 2>&1 \
      | tee -a "$OUT/device.log" || status=1
  done
  unset PM_VARIANT
  "$PY" scripts/compare_variants.py "$OUT" --out "$OUT" 2>&1 | tee -a "$OUT/device.log" || status=1
  return $status
}

# Which rung, tile order or cluster size fails at a shape, each in a process of its own, then
# memcheck on the first failure (scripts/crash_search.py; CRASH_ARGS: e.g. --shapes ...); CU124=1
# searches the CUDA 12.4 variant (loaded by path, libcudart.so.12 from the carried wheel).
crash_search() {
  local cudart=/tmp/cudart12/nvidia/cuda_runtime/lib wheel variant=""
  if [ -n "${CU124:-}" ]; then
    wheel=$(ls .whl/nvidia_cuda_runtime_cu12-*.whl 2>/dev/null | head -n 1)
    [ -n "$wheel" ] || { echo "crash_search: no nvidia-cuda-runtime-cu12 wheel in .whl/"; return 1; }
    "$PY" -m zipfile -e "$wheel" /tmp/cudart12
    variant="torch-stable-abi210-cu124-$(uname -m)-linux"
  fi
  # shellcheck disable=SC2086  # CRASH_ARGS: extra arguments, word-split on purpose
  PM_VARIANT="${variant:-${PM_VARIANT:-}}" LD_LIBRARY_PATH="$cudart:${LD_LIBRARY_PATH:-}" timeout -s ABRT -k 5 400 \
    "$PY" scripts/crash_search.py --memcheck ${CRASH_ARGS:-} 2>&1 | tee "$OUT/crash_search.log"
}

# Where each persistent rung's tiles ran, per tile order, at the large square shapes.
timelines() {
  local shape
  for shape in 4096x4096x4096 8192x8192x8192 8192x8192x1024; do
    timeout -s ABRT -k 5 60 "$PY" scripts/timeline_stats.py --shape "$shape" tiled persistent persistent-grouped wgmma \
      wgmma_persistent wgmma_persistent-grouped 2>&1 | tee -a "$OUT/device.log" || return 1
  done
}

# Where a call's GPU time goes (operand copies, the matmul) at the shapes that copy or tile raggedly.
kernel_times() {
  local shape
  for shape in 4097x4097x4097 3000x3000x3000; do
    timeout -s ABRT -k 5 60 "$PY" scripts/profile_workload.py --kernel-times --repeat 10 --shape "$shape" wgmma \
      wgmma_persistent persistent 2>&1 | tee -a "$OUT/device.log" || return 1
  done
}

# Nsight Compute on the tensor-core and fp32 kernels at 4096^3 (clocks left alone).
profile() {
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  {
    timeout 120 "$ncu" --clock-control none -k 'regex:tiled_kernel|persistent_kernel' --launch-skip 2 \
      --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      "$PY" scripts/profile_workload.py --shape 4096x4096x4096 tiled persistent
    timeout 60 "$ncu" --clock-control none -k 'regex:warptiled_kernel' --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats \
      "$PY" scripts/profile_workload.py --shape 4096x4096x4096 --dtype float32 warptiled
  } >"$OUT/ncu.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" "$OUT/ncu.txt" | head -30
}

# Nsight Compute at one token (1 x 4096 x 4096, nn.Linear's weight layout): cuBLAS's kernel
# beside wgmma_streamk's, two launches each after a warm one, into ncu_decode.txt: where the
# stream-K rung's fixed cost a call goes (launch, first loads, the partial sums at the end).
# PROFILE_SHAPE and PROFILE_RUNGS name another shape and other rungs.
profile_decode() {
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # The first launches are the operands' normal_ fills and cuBLAS's warm call: skipped.
  # shellcheck disable=SC2086  # PROFILE_RUNGS: a list of rung names
  timeout 180 "$ncu" --clock-control none --launch-skip 3 --launch-count 5 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats \
    "$PY" scripts/profile_workload.py --k-major-b --repeat 3 --shape "${PROFILE_SHAPE:-1x4096x4096}" torch.matmul \
    ${PROFILE_RUNGS:-wgmma_streamk} >"$OUT/ncu_decode.txt" 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Elapsed Cycles|Grid Size|Registers Per|No Eligible|Issued Warp" \
    "$OUT/ncu_decode.txt" | head -80
}

# Nsight Compute on wgmma_persistent with and without 2-CTA clusters at 4096^3:
# one launch of each after a warm one (the workload runs c2 c2 c1 c1).
profile_hopper() {
  local ncu
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout 180 "$ncu" --clock-control none -k 'regex:wgmma_persistent_kernel' --launch-skip 1 --launch-count 3 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats \
    "$PY" scripts/profile_workload.py --repeat 2 --shape 4096x4096x4096 wgmma_persistent wgmma_persistent-cluster1 \
    >"$OUT/ncu_hopper.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Cluster Size|Grid Size|Stall|No Eligible|Issued Warp" \
    "$OUT/ncu_hopper.txt" | head -60
}

# compute-sanitizer TOOL [RUNG ...] over a small workload; the head of its report
# (where the first error is) and its summary go to sanitizer.log.
sanitizer() {
  local tool=$1 cs rc=0 limit=90 quick=()
  # racecheck tracks every shared-memory access: far slower, so one dtype and layout (--quick)
  [ "$tool" = racecheck ] && limit=180 && quick=(--quick)
  shift
  cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "### compute-sanitizer --tool $tool, rungs: ${*:-all}" >>"$OUT/sanitizer.log"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$limit" "$cs" --tool "$tool" --error-exitcode 9 --print-limit 4 \
    "$PY" scripts/sanitize_workload.py "${quick[@]}" "$@" >/tmp/sanitizer.txt 2>&1 || rc=$?
  { head -n 60 /tmp/sanitizer.txt; echo "[...]"; tail -n 4 /tmp/sanitizer.txt; } >>"$OUT/sanitizer.log"
  tail -n 4 /tmp/sanitizer.txt
  return $rc
}

# Each rung in its own process under a timeout: a kernel that hangs (a pipeline
# deadlock) is reported and killed, not waited on.
smoke() {
  local rung rc=0
  for rung in naive warptiled tiled persistent persistent-grouped wgmma wgmma_persistent splitk wgmma_streamk \
    wgmma_persistent-grouped; do
    timeout -s ABRT -k 5 60 "$PY" scripts/smoke_test.py "$rung" 2>&1 | tee -a "$OUT/device.log" || rc=1
  done
  return $rc
}

# The Hopper rungs' machine code: wgmma (HGMMA) and TMA loads (UTMALDG) in the sm_90a SASS.
sass() {
  local so
  so=$(ls build/torch-*/*.so | head -1)
  cuobjdump --dump-sass --gpu-architecture sm_90a "$so" >/tmp/sass.txt 2>&1 || return 1
  grep -oE "HGMMA\.[0-9x]+\.F32(\.BF16)?|UTMALDG\.2D|USETMAXREG\.[A-Z.]+|SYNCS\.[A-Z.]+" /tmp/sass.txt |
    sort | uniq -c | tee -a "$OUT/device.log"
  grep -q HGMMA /tmp/sass.txt && grep -q UTMALDG /tmp/sass.txt
}

# Models built from config with our layers (examples/), and the end-to-end
# forward timing table of issue 7.
integration() {
  local rc=0
  timeout -s ABRT -k 5 120 "$PY" examples/transformers_llama.py 2>&1 | tee -a "$OUT/device.log" || rc=1
  timeout -s ABRT -k 5 120 "$PY" examples/diffusers_unet.py 2>&1 | tee -a "$OUT/device.log" || rc=1
  timeout -s ABRT -k 5 180 "$PY" scripts/integration_timing.py --out "$OUT/integration.md" 2>&1 | tee -a "$OUT/device.log" || rc=1
  return $rc
}

# Each tool over each rung, a process apiece: a rung's report names its own kernels.
sanitizers() {
  local tool rung
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    for rung in ${SANITIZE_RUNGS:-naive warptiled tiled persistent wgmma wgmma_persistent splitk wgmma_streamk}; do
      run_step "compute-sanitizer $tool $rung" sanitizer "$tool" "$rung"
    done
  done
}

run_step "install carried wheels" install_wheels
if [ -d /tmp/site ]; then
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
run_step "GPU info" gpu_info
run_step "load the prebuilt variant" check_variant
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(smoke gpu_tests sweep demo benchmark timelines kernel_times integration sanitizers profile sass)
for step in "${STEPS[@]}"; do
  case $step in
    smoke) run_step "smoke test, every rung" smoke ;;
    gpu_tests) run_step "GPU tests (pytest -m gpu)" gpu_tests ;;
    sweep) run_step "correctness sweep" sweep ;;
    demo) run_step "demo --record" demo ;;
    benchmark) run_step "benchmark table" benchmark ;;
    compare) run_step "build/ against \$BASELINE" compare ;;
    decode_rungs) run_step "skinny rungs side by side" decode_rungs ;;
    model_benchmark) run_step "model benchmark" model_benchmark ;;
    tp_benchmark) run_step "tensor parallelism on 2 GPUs" tp_benchmark ;;
    cu124) run_step "the CUDA 12.4 variant: GPU tests, benchmark beside cu130" cu124 ;;
    timelines) run_step "tile timelines" timelines ;;
    kernel_times) run_step "GPU time per kernel of a call" kernel_times ;;
    sanitizers) sanitizers ;;
    profile) run_step "ncu profile" profile ;;
    profile_hopper) run_step "ncu profile, wgmma_persistent clusters" profile_hopper ;;
    crash_search) run_step "which configuration fails (scripts/crash_search.py)" crash_search ;;
    profile_decode) run_step "ncu profile, one token: cuBLAS and wgmma_streamk" profile_decode ;;
    sass) run_step "sm_90a SASS: HGMMA and TMA" sass ;;
    integration) run_step "transformers and diffusers examples, timing" integration ;;
    *) echo "unknown step: $step"; FAILED+=("$step") ;;
  esac
done
run_step "GPU info after" gpu_info

echo
echo "=== files in \$OUT:"
ls -l "$OUT"
echo "=== total $((SECONDS - START)) s"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "=== FAILED steps: ${FAILED[*]}"
  exit 1
fi
echo "=== all steps passed"
