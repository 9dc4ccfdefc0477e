#!/usr/bin/env bash
# On the GPU machine: multi-token steps through the bulk GEMV's token groups
# with each weight chunk decoded once for the group (plan key
# bulk_group_once), the RMSNorm taken in the groups' inputs (bulk_group_norm),
# small inputs staged in each block instead of a quantize launch
# (bulk_group_stage_cols) and rows too long for whole-row tiles in slices of
# K (bulk_group_kslice), against the defaults and against plain token groups
# of up to 8, in one call so the machine is the same.
#   1. the GPU tests of the token groups (GemvBulk.*, RouteLaunch*, the
#      batched step's token-group cases against the CPU forward pass);
#   2. bench decode tok/s at --batch 1 (defaults only: no group runs) and
#      each of BATCHES (default "2 4 8") under each of PLANS (default
#      "defaults groups8 once+norm+stage all"; also: once; all: long rows in
#      slices of K, bulk_group_kslice).
#
#   scripts/device-group-once.sh BUILD_DIR MODEL.gguf...
# ARGS (default "-p 128 -n 128 -r 3"); TESTS=0 skips part 1.
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
shift || true
eh="$build/bin/engine-host"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
fails=0

# ---- 1. correctness --------------------------------------------------------
if [ "${TESTS:-1}" != 0 ] && [ -x "$build/bin/eh_cuda_tests" ]; then
  if "$build/bin/eh_cuda_tests" --gtest_filter='GemvBulk.TokenGroups*:RouteLaunch*:Archs/BatchedStep.*groups*' 2>&1 |
     tee /tmp/group-once-tests.log | tail -4 | grep -q PASSED; then
    echo "PASS GemvBulk.TokenGroups*, RouteLaunch*, BatchedStep groups"
  else
    echo "FAIL (the failures:)"; grep -E "^\[  FAILED|Failure|error" /tmp/group-once-tests.log | head -20
    fails=$((fails + 1))
  fi
fi

# ---- 2. speed ----------------------------------------------------------------
bench() {  # MODEL BATCH OPTIONS -> decode tok/s
  "$eh" bench --plugins "$build/plugins" --plugin llama-cuda --model "$1" ${ARGS:--p 128 -n 128 -r 3} --batch "$2" \
    --engine-options "$3" --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print("%.1f" % r["decode_tokens_per_s"] if r.get("ok") else "failed: " + r.get("error", ""))' 2>&1
}
declare -A plans=(
  [defaults]='{}'
  [groups8]='{"kernels":{"bulk_max_tokens":8}}'
  [once]='{"kernels":{"bulk_max_tokens":8,"bulk_group_once":true}}'
  [once+norm+stage]='{"kernels":{"bulk_max_tokens":8,"bulk_group_once":true,"bulk_group_norm":true,"bulk_group_stage_cols":1024}}'
  [all]='{"kernels":{"bulk_max_tokens":8,"bulk_group_once":true,"bulk_group_norm":true,"bulk_group_stage_cols":1024,"bulk_group_kslice":true}}'
)
for model in "$@"; do
  name=$(basename "$model" .gguf)
  echo "$name batch 1: decode tok/s defaults $(bench "$model" 1 '{}')"
  for b in ${BATCHES:-2 4 8}; do
    line="$name batch $b: decode tok/s"
    for p in ${PLANS:-defaults groups8 once+norm+stage all}; do line+="  $p $(bench "$model" "$b" "${plans[$p]}")"; done
    echo "$line"
  done
done
echo "device-group-once: $fails failed"
[ $fails -eq 0 ]
