#!/usr/bin/env bash
# On the GPU machine: the bulk GEMV's token groups (a matmul of 2..8 tokens
# reads each weight once for the group) against what batched steps of that
# size ran before them (one single-token GEMV per token on side streams, or
# cuBLAS on FP16 mirrors from 3 tokens): the plan key bulk_max_tokens 8
# against 1 (no groups; the default is 2), alternating in one call so the machine is the same.
#   1. GemvBulk.* (token groups against one token at a time);
#   2. bench decode at --batch 1, 2, 4, 8 for each forged profile, both sides,
#      AB_ROUNDS rounds (default 2).
#
#   scripts/device-bulk-groups.sh BUILD_DIR [PROFILE...]
# PROFILE: forge profiles (default qwen2.5-0.5b-instruct-q4_k_m
# llama-3.1-8b-instruct-q4_k_m); MODELS_DIR (default /tmp/eh-forged);
# BATCHES (default "1 2 4 8"); ARGS (default "-p 128 -n 128 -r 3").
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
shift || true
profiles=${*:-qwen2.5-0.5b-instruct-q4_k_m llama-3.1-8b-instruct-q4_k_m}
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/tmp/eh-forged}
mkdir -p "$models"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null || echo unknown)"
fails=0

# ---- 1. correctness --------------------------------------------------------
if [ -x "$build/bin/eh_cuda_tests" ]; then
  if "$build/bin/eh_cuda_tests" --gtest_filter='GemvBulk.*:RouteLaunch*' 2>&1 | tail -4 | tee /tmp/bulk-groups-test.log |
     grep -q PASSED; then
    echo "PASS GemvBulk.* and RouteLaunch*"
  else
    echo "FAIL GemvBulk.* / RouteLaunch*"; fails=$((fails + 1))
  fi
fi

# ---- 2. speed ----------------------------------------------------------------
bench() {  # MODEL BATCH OPTIONS -> "decode_tok/s tg/seq"
  "$eh" bench --plugins "$build/plugins" --plugin llama-cuda --model "$1" ${ARGS:--p 128 -n 128 -r 3} --batch "$2" \
    --engine-options "$3" --json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print("%.1f" % r["decode_tokens_per_s"] if r.get("ok") else "failed: " + r.get("error", ""))' 2>&1
}
for prof in $profiles; do
  model="$models/$prof.gguf"
  [ -f "$model" ] || "$eh" forge --like "$prof" --out "$model" -q || { echo "forge $prof failed"; fails=$((fails + 1)); continue; }
  for b in ${BATCHES:-1 2 4 8}; do
    for ((r = 1; r <= ${AB_ROUNDS:-2}; ++r)); do
      on=$(bench "$model" "$b" '{"kernels":{"bulk_max_tokens":8}}')
      off=$(bench "$model" "$b" '{"kernels":{"bulk_max_tokens":1}}')
      echo "$prof batch $b round $r: decode tok/s  token groups $on   one GEMV a token / cuBLAS $off"
    done
  done
done
echo "device-bulk-groups: $fails failed"
[ $fails -eq 0 ]
