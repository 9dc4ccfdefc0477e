#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh (or its equivalent):
# gpt-cuda's batched step — its GPU tests (eh_gpt_batch_tests, and the
# whole-model tests of eh_gpt_cuda_tests), then on the forged gpt-oss-20b
# one sequence's pp512 / tg128 beside the batched step's cost
# per batch size (and with the per-token knobs for 2..8 tokens), then with
# LOAD=1 aggregate tokens/s through the HTTP API (engine-host loadgen, 128
# output tokens) at LEVELS clients. Results go to $OUT.
#   OUT=... [LOAD=1] [LEVELS=1,4,16,64] scripts/device-gpt-batch.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/eh-gptbatch}
levels=${LEVELS:-1,4,16,64}
mkdir -p "$out" /tmp/eh-models
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
export EH_GPT_CUDA_PLUGIN="$build/plugins/libeh-gpt-cuda.so" EH_CPUREF_PLUGIN="$build/plugins/libeh-cpu-reference.so"
summary() { grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|\[gpt-batch\]|\[bench\]|decode|forged" -A3 "$1" | head -${2:-60}; }
timeout 240 "$build/bin/eh_gpt_batch_tests" --gtest_filter='-GptCudaBench.*' --gtest_brief=1 > "$out/batch-tests.log" 2>&1; echo "batch tests rc=$?"
summary "$out/batch-tests.log"
if [ -x "$build/bin/eh_gpt_cuda_tests" ]; then
  timeout 120 "$build/bin/eh_gpt_cuda_tests" --gtest_filter='Tiny/GptModels.*:GptCuda.*' --gtest_brief=1 \
    > "$out/model-tests.log" 2>&1; echo "model tests rc=$?"
  summary "$out/model-tests.log" 20
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0
# With engine-host staged: the forged file with the real vocabulary (the
# HTTP load needs it); without: the bench forges one with a synthetic one.
model=/tmp/eh-models/gpt-oss-20b.gguf
if [ -x "$build/bin/engine-host" ]; then
  t0=$(date +%s)
  [ -f "$model" ] || "$build/bin/engine-host" forge --like gpt-oss-20b-mxfp4 --out "$model" -q && sync
  echo "forge+sync $(( $(date +%s) - t0 )) s"
  export EH_GPT_CUDA_BENCH_MODEL="$model"
else
  export EH_GPT_CUDA_BENCH_FORGE=/tmp/eh-models
fi
timeout 240 "$build/bin/eh_gpt_batch_tests" --gtest_filter='GptCudaBench.*' > "$out/bench.log" 2>&1; echo "bench rc=$?"
summary "$out/bench.log"
# The measurement knobs (batch.cpp) at the larger batches, KNOBS="a b":
# each a kernel plan object without spaces, set as EHCUDA_PLAN.
i=0
for knob in ${KNOBS:-'{"batch_moe_grouped_max":32}' '{"batch_gemv_per_token":64}'}; do
  i=$((i + 1))
  EHCUDA_PLAN="$knob" EH_BENCH_BATCHES=${KNOB_BATCHES:-16,32,64} timeout 90 "$build/bin/eh_gpt_batch_tests" \
    --gtest_filter='GptCudaBench.GptOss20bBatchedStep' > "$out/bench-knob$i.log" 2>&1
  echo "$knob:"; grep "batch " "$out/bench-knob$i.log"
done
[ "${LOAD:-0}" = 1 ] || exit 0
"$build/bin/engine-host" --plugins "$build/plugins" --port 18701 --log-format text --log-level warn --model "$model" \
  --ctx-size 4096 > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf localhost:18701/health > /dev/null && break; sleep 0.5; done
timeout 200 "$build/bin/engine-host" loadgen --url http://127.0.0.1:18701 --levels "$levels" -n 128 --json > "$out/load.json"
echo "loadgen rc=$?"; head -c 3000 "$out/load.json"; echo
kill $pid; wait $pid 2>/dev/null
tail -5 "$out/serve.log"
