#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh: llama-cuda's batched
# step — its GPU tests, then aggregate decode throughput through the HTTP
# API (engine-host loadgen, 128 output tokens) at 1/16/64 clients on the
# forged Qwen2.5-0.5B Q4_K_M. Results go to $OUT.
#   OUT=... scripts/device-batch.sh BUILD_DIR [LEVELS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
levels=${2:-1,16,64}
out=${OUT:-/tmp/eh-batch}
mkdir -p "$out" /tmp/eh-models
eh="$build/bin/engine-host"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
export EH_LLAMA_CUDA_PLUGIN="$build/plugins/libeh-llama-cuda.so"
timeout 300 "$build/bin/eh_cuda_tests" --gtest_filter="${BATCH_FILTER:-Batched*:*/BatchedStep.*}" --gtest_brief=1 \
  > "$out/batch-tests.log" 2>&1; echo "batch tests rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|\[batch\]" -A3 "$out/batch-tests.log" | head -60
[ "${SKIP_LOAD:-0}" = 1 ] && exit 0
"$eh" forge --like qwen2.5-0.5b-instruct-q4_k_m --out /tmp/eh-models/qwen.gguf -q
"$eh" --plugins "$build/plugins" --port 18700 --log-format text --log-level warn --model /tmp/eh-models/qwen.gguf \
  --ctx-size 4096 > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf localhost:18700/health > /dev/null && break; sleep 0.5; done
curl -s localhost:18700/health > "$out/health.json"
timeout 240 "$eh" loadgen --url http://127.0.0.1:18700 --levels "$levels" -n 128 --json > "$out/load.json"
echo "loadgen rc=$?"; cat "$out/load.json" | head -c 3000; echo
kill $pid; wait $pid 2>/dev/null
tail -5 "$out/serve.log"
timeout 120 "$eh" bench --plugins "$build/plugins" --model /tmp/eh-models/qwen.gguf -p 512 -n 128 2>&1 | tail -4
