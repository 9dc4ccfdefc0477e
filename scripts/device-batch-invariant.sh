#!/usr/bin/env bash
# On the GPU machine: gpt-cuda's batch invariance (cuda-common/README.md,
# Determinism). In order, each part under its own time limit:
#   1. the kernels' tests (moe_router_rows, moe_decode_mma against the
#      grouped passes, bit for bit);
#   2. eh-plugin-check's batch_invariance and batch_compositions on the
#      tiny Qwen3-MoE and gpt-oss files, batch_invariant off and on, and on
#      llama-cuda's tiny Llama 3.1 (what it holds to, for the docs);
#   3. the cost: bench on forged gpt-oss-20b and Qwen3-30B-A3B (MODELS dir,
#      forged there when missing), batch_invariant off and on: one
#      sequence's pp512 / tg128, and 64 sequences' decode;
#   4. with SANITIZE=1, memcheck and racecheck on the small kernel cases.
#   OUT=... [MODELS=/tmp/m] [BENCH="goss:gpt-oss-20b-mxfp4 ..."] [SANITIZE=1]
#     scripts/device-batch-invariant.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/eh-inv}
models=${MODELS:-/tmp/m}
mkdir -p "$out" "$models" "$out/tiny"
export EH_GPT_CUDA_PLUGIN="$build/plugins/libeh-gpt-cuda.so" EH_CPUREF_PLUGIN="$build/plugins/libeh-cpu-reference.so"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

stamp "kernel tests"
timeout 90 "$build/bin/eh_gpt_cuda_tests" --gtest_filter='*MoeRouterRows*:*MoeDecodeMma*' \
  --gtest_brief=1 > "$out/kernel-tests.log" 2>&1
echo "kernel tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|Failure|Expected|Which is|differ|token [0-9]+ of" "$out/kernel-tests.log" | head -40

stamp "plugin checks"
for prof in tiny-qwen3-moe-q4_k_m tiny-gpt-oss-mxfp4 tiny-llama-3.1-q4_k_m; do
  "$build/bin/engine-host" forge --like "$prof" --out "$out/tiny/$prof.gguf" -q > /dev/null 2>&1
  plugin=gpt-cuda opts_list=('{"batch_invariant":false}' '{"batch_invariant":true}')
  [[ $prof == tiny-llama* ]] && plugin=llama-cuda opts_list=('{}')
  for opts in "${opts_list[@]}"; do
    r=$(timeout 60 "$build/bin/eh-plugin-check" "$build/plugins/libeh-$plugin.so" --model "$out/tiny/$prof.gguf" \
        --engine-options "$opts" --only batch_invariance --only batch_compositions --only chunked_prefill \
        --only prefill_beside_decode 2>&1)
    echo "$plugin $prof $opts:"; echo "$r" | grep -E "PASS|FAIL|SKIP|differ" | cut -c1-220
  done
done

stamp "bench"
bench() {  # model options batch p n r
  timeout 60 "$build/bin/engine-host" bench --plugins "$build/plugins" --plugin gpt-cuda --model "$1" \
    --engine-options "$2" --batch "$3" -p "$4" -n "$5" -r "$6" 2>&1 | grep -E "^\| gpt-cuda|rror" | head -4
}
for spec in ${BENCH:-goss:gpt-oss-20b-mxfp4 q3moe:qwen3-30b-a3b-q4_k_m}; do
  f=$models/${spec%%:*}.gguf
  [ -f "$f" ] || { stamp "forging $f"; "$build/bin/engine-host" forge --like "${spec#*:}" --out "$f" -q > /dev/null 2>&1; }
  for opts in '{"batch_invariant":false}' '{"batch_invariant":true}'; do
    stamp "$f $opts batch 1"; bench "$f" "$opts" 1 512 128 3
    stamp "$f $opts batch 64"; bench "$f" "$opts" 64 128 64 1
  done
done

[ "${SANITIZE:-0}" = 1 ] || { stamp done; exit 0; }
for tool in memcheck racecheck; do
  stamp "$tool"
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/bin/eh_gpt_cuda_tests" \
    --gtest_filter='*X12_E96*:*Q6_K_Q4_K_E512*:*Q4_K_MXFP4_E512*' --gtest_brief=1 > "$out/$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/$tool.log" | head -5
done
stamp done
