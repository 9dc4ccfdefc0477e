#!/usr/bin/env bash
# Runs the CUDA plugin's GPU checks on a machine with an NVIDIA GPU:
# the full GPU test suite, compute-sanitizer memcheck and racecheck on a
# representative subset, and the first benchmark numbers.
#
#   scripts/device-gpu-tests.sh <dir> [out-dir]
#
# <dir> holds bin/eh_cuda_tests, bin/eh_cuda_probe_test,
# plugins/libeh-llama-cuda.so and plugins/libeh-cpu-reference.so (a build
# tree, or a copy of those parts).
# Logs go to out-dir (default $OUT, else /tmp/eh-gpu-tests).
set -u
D=$(cd "${1:-build}" && pwd)
OUT_DIR=${2:-${OUT:-/tmp/eh-gpu-tests}}
mkdir -p "$OUT_DIR"
export EH_LLAMA_CUDA_PLUGIN="$D/plugins/libeh-llama-cuda.so"
# The CPU reference plugin (numeric oracle) for the cross-check tests.
[ -f "$D/plugins/libeh-cpu-reference.so" ] && export EH_CPU_REFERENCE_PLUGIN="$D/plugins/libeh-cpu-reference.so"
T="$D/bin/eh_cuda_tests"
rc=0
step() { echo "=== $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3

step "probe"
"$D/bin/eh_cuda_probe_test" 2>&1 | grep -E "probe:|PASSED|FAILED" || rc=1

step "GPU test suite"
"$T" --gtest_brief=1 > "$OUT_DIR/tests.log" 2>&1 || rc=1
grep -E "^\[  PASSED|^\[  SKIPPED|^\[  FAILED" "$OUT_DIR/tests.log" | head -40
grep -E -A4 "Failure" "$OUT_DIR/tests.log" | head -40
step "GPU test suite with the int8-input GEMV path"
EHCUDA_PLAN='{"gemv_input": "int8"}' "$T" --gtest_brief=1 > "$OUT_DIR/tests_q8x.log" 2>&1 || rc=1
grep -E "^\[  PASSED|^\[  SKIPPED|^\[  FAILED" "$OUT_DIR/tests_q8x.log" | head -40
grep -E -A4 "Failure" "$OUT_DIR/tests_q8x.log" | head -20

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    step "bench"
    "$T" --gtest_also_run_disabled_tests --gtest_filter="${BENCH_FILTER:-Bench.*}" 2>&1 | tee "$OUT_DIR/bench.log" | grep -E "\[bench\]|FAILED|Failure"
    step "bench, int8-input GEMV"
    EHCUDA_PLAN='{"gemv_input": "int8"}' "$T" --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_Qwen*:Bench.DISABLED_Phi3*' 2>&1 | tee "$OUT_DIR/bench_q8x.log" | grep -E "pp512|FAILED|Failure"
fi
ncu_summary() {
    python3 - "$1" <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows"); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    name = re.sub(r"\(.*", "", r[ki])[:60]
    v = float(r[vi].replace(",", ""))
    v = v / 1000 if r[ui] in ("nsecond", "ns") else v  # -> microseconds
    agg[name][0] += 1; agg[name][1] += v
tot = sum(a[1] for a in agg.values())
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{t:9.1f} us {n:4d}x  {k}")
print(f"{tot:9.1f} us total kernel time (ncu clocks)")
PY
}
if [ "${PROFILE:-0}" = 1 ] && command -v ncu > /dev/null; then
    # Per-kernel times of one graph-replayed decode step of the 0.5B shape:
    # skip load + 16-token prefill + the eager first step.
    step "ncu: one decode step (qwen2.5-0.5b shape)"
    EH_BENCH_SKIP_PP=1 timeout 100 ncu --csv --metrics gpu__time_duration.sum --launch-skip 440 --launch-count 172 \
        "$T" --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_Qwen*' > "$OUT_DIR/ncu.csv" 2> "$OUT_DIR/ncu.err"
    ncu_summary "$OUT_DIR/ncu.csv"
    step "ncu: one pp512 prefill (qwen2.5-0.5b shape)"
    timeout 100 ncu --csv --metrics gpu__time_duration.sum --launch-skip 0 --launch-count 280 \
        "$T" --gtest_also_run_disabled_tests --gtest_filter='Bench.DISABLED_Qwen*' > "$OUT_DIR/ncu_pp.csv" 2> "$OUT_DIR/ncu_pp.err"
    ncu_summary "$OUT_DIR/ncu_pp.csv"
fi

SUBSET=${MEM_FILTER:-'FusedDecode.*:PrefillAttention*:BatchedStep*:QuantTypes.*:Kernels.*:AllTypes/MatmulTest.*_n1:AllTypes/MatmulTest.*_n77:Shapes/*:DeviceSampler.*:ArchTypes/ModelVsReference.*/llama_Q4_K:ArchTypes/ModelVsReference.*/phi3_Q6_K:ArchTypes/ModelVsReference.*/qwen2_Q5_0:LlamaCuda.SequenceFullAndBadTokens:LlamaCuda.GenerationIsReproducible'}
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer > /dev/null; then
  if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
    step "compute-sanitizer memcheck (subset)"
    timeout "${SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 3 "$T" --gtest_brief=1 --gtest_filter="$SUBSET" \
        > "$OUT_DIR/memcheck.log" 2>&1 || rc=1
    tail -n 4 "$OUT_DIR/memcheck.log"
  fi
    step "compute-sanitizer racecheck (subset)"
    timeout "${SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool racecheck --error-exitcode 3 "$T" --gtest_brief=1 \
        --gtest_filter="${RACE_FILTER:-FusedDecode.Paged*:PrefillAttention*:Shapes/*:DeviceSampler.TopK*:DeviceSampler.RepetitionPenalty*:Kernels.Rms*:AllTypes/MatmulTest.*/Q4_K_n77:AllTypes/MatmulTest.*/Q6_K_n1:ArchTypes/ModelVsReference.*/qwen2_Q4_K}" \
        > "$OUT_DIR/racecheck.log" 2>&1 || rc=1
    tail -n 4 "$OUT_DIR/racecheck.log"
fi

exit $rc
