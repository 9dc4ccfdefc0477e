#!/usr/bin/env bash
# Runs the CUDA plugin's GPU checks on a machine with an NVIDIA GPU:
# the full GPU test suite, compute-sanitizer memcheck and racecheck on a
# representative subset, and the first benchmark numbers.
#
#   scripts/device-gpu-tests.sh <dir> [out-dir]
#
# <dir> holds bin/eh_cuda_tests, bin/eh_cuda_probe_test and
# plugins/libeh-llama-cuda.so (a build tree, or a copy of its parts).
# Logs go to out-dir (default $OUT, else /tmp/eh-gpu-tests).
set -u
D=$(cd "${1:-build}" && pwd)
OUT_DIR=${2:-${OUT:-/tmp/eh-gpu-tests}}
mkdir -p "$OUT_DIR"
export EH_LLAMA_CUDA_PLUGIN="$D/plugins/libeh-llama-cuda.so"
T="$D/bin/eh_cuda_tests"
rc=0
step() { echo "=== $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3

step "probe"
"$D/bin/eh_cuda_probe_test" 2>&1 | grep -E "probe:|PASSED|FAILED" || rc=1

step "GPU test suite"
"$T" --gtest_brief=1 > "$OUT_DIR/tests.log" 2>&1 || rc=1
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|error|Expected|Which is|actual" "$OUT_DIR/tests.log" | head -80

SUBSET='Kernels.*:AllTypes/MatmulTest.*_n1:AllTypes/MatmulTest.*_n77:Shapes/*:DeviceSampler.*:ArchTypes/ModelVsReference.*/llama_Q4_K:ArchTypes/ModelVsReference.*/phi3_Q6_K:ArchTypes/ModelVsReference.*/qwen2_Q5_0:LlamaCuda.ContextFullAndBadTokens:LlamaCuda.GenerationIsReproducible'
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer > /dev/null; then
    step "compute-sanitizer memcheck (subset)"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$T" --gtest_brief=1 --gtest_filter="$SUBSET" \
        > "$OUT_DIR/memcheck.log" 2>&1 || rc=1
    tail -n 4 "$OUT_DIR/memcheck.log"
    step "compute-sanitizer racecheck (subset)"
    compute-sanitizer --tool racecheck --error-exitcode 3 "$T" --gtest_brief=1 \
        --gtest_filter='Shapes/*:DeviceSampler.*:AllTypes/MatmulTest.*/Q4_K_n77:Kernels.Rms*:ArchTypes/ModelVsReference.*/qwen2_Q4_K' \
        > "$OUT_DIR/racecheck.log" 2>&1 || rc=1
    tail -n 4 "$OUT_DIR/racecheck.log"
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    step "bench"
    "$T" --gtest_also_run_disabled_tests --gtest_filter="${BENCH_FILTER:-Bench.*}" 2>&1 | tee "$OUT_DIR/bench.log" | grep -E "\[bench\]|FAILED|Failure"
fi
exit $rc
