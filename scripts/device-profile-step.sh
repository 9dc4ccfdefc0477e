#!/usr/bin/env bash
# On the GPU machine: the kernels of one decode step, each timed by ncu
# (gpu__time_duration, no cache flush, clocks as the bench runs them), for
# one sequence's decode steps and the batched step at each batch size, on the
# forged-shape Qwen2.5-0.5B (or $MODEL: Qwen25_05B, Phi3Mini). Prints one
# table per run: kernel, launches, total us. The bench's own timing is
# printed first, without ncu.
#   scripts/device-profile-step.sh BUILD_DIR [BATCHES]
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
batches=${2:-1}
model=${MODEL:-Qwen25_05B}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
export EH_LLAMA_CUDA_PLUGIN="$build/plugins/libeh-llama-cuda.so" EH_BENCH_SKIP_PP=1
t="$build/bin/eh_cuda_tests --gtest_also_run_disabled_tests"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
EH_BENCH_BATCHES=$batches $t --gtest_filter="Bench.DISABLED_Batched_$model:Bench.DISABLED_${model}_Q4KM_Shape" 2>&1 | grep "\[bench\]"
summarize() { python3 "$(dirname "$0")/ncu-summary.py"; }  # kernel, launches, total us (sorted)
prof() {
  EH_BENCH_PROFILE_STEP=${STEP:-10} timeout 300 $ncu --profile-from-start off --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum --csv --print-units base "$@" 2>/dev/null | summarize
}
echo "== one sequence's decode ($model)"
prof $t --gtest_filter="Bench.DISABLED_${model}_Q4KM_Shape"
for b in ${batches//,/ }; do
  echo "== batched step, batch $b ($model)"
  EH_BENCH_BATCHES=$b prof $t --gtest_filter="Bench.DISABLED_Batched_$model"
done
