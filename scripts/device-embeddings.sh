#!/usr/bin/env bash
# Embeddings and rerank on llama-cuda, on the GPU machine (issue 49), in one
# call after device-unpack.sh:
#   1. correctness (TESTS=1, the default): eh_cuda_hidden_tests (llama-cuda's
#      hidden states against the CPU reference's, cosine >= 0.9999),
#      embeddings_gpu_test.py (/v1/embeddings and /v1/rerank through the
#      server on llama-cuda against the CPU reference; gpt-cuda refused), and
#      eh-plugin-check's hidden_state on llama-cuda (stories260K against the
#      CPU reference, forged tiny Qwen3);
#   2. throughput (BENCH=1; needs llama.cpp unpacked in /tmp/lc): a forged
#      PROFILE (default qwen3-8b-q4_k_m, Qwen3-Embedding-8B's shape) served
#      with --embedding through llama-cuda, then by llama-server --embeddings
#      --pooling last on the same file, each measured by
#      scripts/embeddings_throughput.py on the same 1,000 inputs of ~200
#      tokens (WORDS 190 words each), PER_REQUEST inputs a request,
#      CONCURRENCY requests at a time; the ratio of inputs per second.
#
#   scripts/device-embeddings.sh BUILD_DIR
# Environment: TESTS=0 skips part 1, BENCH=1 runs part 2; PROFILE; MODELS_DIR
# (default /dev/shm/eh); OUT (default /tmp/embeddings-out, the servers' logs);
# INPUTS (1000), WORDS (190), PER_REQUEST (100), CONCURRENCY (4);
# EH_ARGS (default "--batch-tokens 8192") and LC_ARGS (default "-np 64 -c 65536
# -b 8192 -ub 8192") for the two servers.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/embeddings-out}
mkdir -p "$out"
status=0
eh="$build/bin/engine-host"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"

if [ "${TESTS:-1}" = 1 ]; then
  "$build/bin/eh_cuda_hidden_tests" 2>&1 | tee "$out/hidden_tests.log" |
    grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|\[hidden-gpu\]|Failure|Expected|Which is|error' | head -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  python3 tests/e2e/embeddings_gpu_test.py "$eh" "$build/plugins" 2>&1 | tee "$out/embeddings_gpu_test.log" |
    grep -E '^(PASS|FAIL)|\[embeddings-gpu\]' | head -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  testdata=$(sed -n 's/^EH_TESTDATA_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" | head -1)
  tiny="$out/tiny-qwen3-q4_k_m.gguf"
  "$eh" forge --like tiny-qwen3-q4_k_m --out "$tiny" -q > /dev/null 2>&1 || { echo "forge tiny-qwen3 failed"; status=1; }
  for model in "$testdata/models/stories260K.gguf" "$tiny"; do
    "$build/bin/eh-plugin-check" "$build/plugins/libeh-llama-cuda.so" --model "$model" \
      --reference "$build/plugins/libeh-cpu-reference.so" > "$out/plugin_check.log" 2>&1
    rc=$?
    echo "eh-plugin-check llama-cuda $(basename "$model"): exit $rc; $(grep -E '(PASS|FAIL|SKIP) +hidden_state' "$out/plugin_check.log" || echo 'hidden_state: not run')"
    [ $rc = 0 ] || { grep -E '^FAIL' "$out/plugin_check.log" | head -5; status=1; }
  done
fi

wait_ready() {  # URL PATTERN PID: the page at URL matches PATTERN, within 10 minutes
  for _ in $(seq 1 1200); do
    curl -sf "$1" 2>/dev/null | grep -q "$2" && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
stop() {  # PID
  kill "$1" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$1" 2>/dev/null
}

if [ "${BENCH:-0}" = 1 ]; then
  profile=${PROFILE:-qwen3-8b-q4_k_m}
  models=${MODELS_DIR:-/dev/shm/eh}
  mkdir -p "$models"
  model="$models/$profile.gguf"
  [ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" -q > "$out/forge.log" 2>&1 ||
    { echo "$profile: forge failed"; tail -3 "$out/forge.log"; exit 1; }
  first=$(( $(date +%s) % 100000 * 10000 ))  # the same inputs for both servers, none cached from before
  measure() {  # NAME URL
    python3 scripts/embeddings_throughput.py --url "$2" --inputs "${INPUTS:-1000}" --words "${WORDS:-190}" \
      --per-request "${PER_REQUEST:-100}" --concurrency "${CONCURRENCY:-4}" --first "$first" > "$out/$1.json" ||
      { echo "$1: the measurement failed"; return 1; }
    echo "$1: $(cat "$out/$1.json")"
  }
  measure_server() {  # NAME PORT HEALTH_PATH PATTERN PID: wait until it is ready, measure it, stop it
    if wait_ready "http://127.0.0.1:$2$3" "$4" "$5"; then
      measure "$1" "http://127.0.0.1:$2" || status=1
    else
      echo "$1 did not become ready"; tail -5 "$out/$1.log"; status=1
    fi
    stop "$5"
  }
  # shellcheck disable=SC2086
  "$eh" serve --plugins "$build/plugins" --model "$model" --device gpu --embedding --port 18431 --ctx-size 1024 \
    ${EH_ARGS:---batch-tokens 8192} --log-format text > "$out/engine-host.log" 2>&1 &
  measure_server engine-host 18431 /health/ready '"ready"' $!
  if [ -x /tmp/lc/llama-server ]; then
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH=/tmp/lc /tmp/lc/llama-server -m "$model" -ngl 99 -fa on --embeddings --pooling last \
      ${LC_ARGS:--np 64 -c 65536 -b 8192 -ub 8192} --port 18432 > "$out/llama-server.log" 2>&1 &
    measure_server llama-server 18432 /health '"ok"' $!
    python3 - "$out/engine-host.json" "$out/llama-server.json" <<'EOF'
import json, sys
try:
    e, l = (json.load(open(p)) for p in sys.argv[1:3])
except (OSError, ValueError) as err:
    sys.exit(f"no ratio: {err}")
print(f"{e['inputs']} inputs of ~{e['tokens_per_input']} tokens: engine-host {e['inputs_per_s']} inputs/s "
      f"({e['tokens_per_s']} tokens/s), llama-server {l['inputs_per_s']} inputs/s ({l['tokens_per_s']} tokens/s) "
      f"=> {e['inputs_per_s'] / l['inputs_per_s']:.2f}x (target 2x)")
EOF
  else
    echo "no llama.cpp in /tmp/lc: engine-host alone"
  fi
fi
exit $status
