#!/usr/bin/env bash
# Gemma 3 on llama-cuda, on the GPU machine (issue 49), in one call after
# device-unpack.sh:
#   1. correctness: eh_cuda_gemma_tests (llama-cuda's batched step against
#      the CPU reference on forged tiny Gemma 3 files whose windows are
#      shorter than the prompts), and eh-plugin-check on the tiny profile;
#   2. where a decode step's time goes (PROFILE=1): ncu's time of each kernel
#      over about two decode steps of `engine-host bench` on the first of
#      PROFILES (after the prompt and the first decode steps), summed per
#      kernel by ncu-summary.py;
#   3. speed (BENCH=1, needs llama.cpp unpacked in /tmp/lc): forged Gemma 3
#      Q4_K_M files through `engine-host bench` (the batched step) beside
#      llama-bench pp512 / tg128, by device-bench-paths.sh.
#
#   scripts/device-gemma.sh BUILD_DIR
# Environment: TESTS=0 skips part 1, PROFILE=1 runs part 2, BENCH=1 part 3;
# PROFILES (default gemma-3-12b-it-q4_k_m) for parts 2 and 3; MODELS_DIR
# (default /dev/shm/eh, as device-bench-paths.sh); OUT (default /tmp/gemma-out).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/gemma-out}
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"

if [ "${TESTS:-1}" = 1 ]; then
  "$build/bin/eh_cuda_gemma_tests" 2>&1 | tee "$out/gemma_tests.log" | grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|\[gemma-batch\]|Failure|Expected|Which is|error' | head -80
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  model="$out/tiny-gemma-3-q4_k_m.gguf"
  "$build/bin/engine-host" forge --like tiny-gemma-3-q4_k_m --out "$model" > "$out/forge.log" 2>&1 || { echo "forge failed"; tail -3 "$out/forge.log"; status=1; }
  "$build/bin/eh-plugin-check" "$build/plugins/libeh-llama-cuda.so" --model "$model" \
    --reference "$build/plugins/libeh-cpu-reference.so" > "$out/plugin_check.log" 2>&1
  rc=$?
  tail -25 "$out/plugin_check.log"
  echo "eh-plugin-check llama-cuda tiny-gemma-3: exit $rc"
  [ $rc = 0 ] || status=1
fi

profiles=${PROFILES:-gemma-3-12b-it-q4_k_m}
models=${MODELS_DIR:-/dev/shm/eh}
if [ "${PROFILE:-0}" = 1 ]; then
  p=${profiles%% *}
  model="$models/$p.gguf"
  mkdir -p "$models"
  [ -s "$model" ] || "$build/bin/engine-host" forge --like "$p" --out "$model" > "$out/$p.forge.log" 2>&1 || { echo "$p: forge failed"; status=1; }
  # One decode step of a Gemma 3 is about 7 kernels a layer; 5,000 launches
  # in, the 8-token prompt and the warm-up are behind.
  echo "== $p: kernels of about two decode steps (ncu, us)"
  timeout 300 "${NCU:-/usr/local/cuda/bin/ncu}" --launch-skip 5000 --launch-count 700 --cache-control none \
    --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$build/bin/engine-host" bench --plugins "$build/plugins" --plugin llama-cuda --model "$model" -p 8 -n 64 -r 1 \
    2>/dev/null | python3 scripts/ncu-summary.py || status=1
fi

if [ "${BENCH:-0}" = 1 ]; then
  entries=""
  for p in $profiles; do entries="$entries $p:llama-cuda"; done
  MODELS_DIR=$models OUT="$out/bench" bash scripts/device-bench-paths.sh "$build" "$entries" || status=1
fi
exit $status
