#!/usr/bin/env bash
# Images on llama-cuda, on the GPU machine (issue 49), in one call after
# device-unpack.sh:
#   1. correctness (TESTS=1, the default): eh_cuda_vision_tests (Gemma 3's
#      tower on the GPU and the step's image rows against the CPU reference),
#      eh-plugin-check's embd_spans on the tiny vision model, and e2e.vision_gpu (the tiny vision profile served by llama-cuda and by
#      cpu-reference over HTTP, image chats compared);
#   2. speed (BENCH=1, needs llama.cpp unpacked in /tmp/lc, README of
#      ../shared/peers): the forged PROFILE (default
#      gemma-3-4b-it-vision-q4_k_m: the 4B text model and SigLIP at 896 px,
#      27 layers of width 1152, F16, the mmproj shape the 4B, 12B and 27B
#      share) through llama-cuda's encoder (VisionGpuBench: encode time per
#      image, an image's prompt with and without its rows) beside llama.cpp's
#      (llama-server --mmproj: its log's "image slice encoded in N ms" for
#      IMAGES different images, the first a warm-up);
#   3. conformance (CONFORMANCE=1, needs torch + transformers and llama.cpp's
#      source in LLAMA_CPP_SRC): tests/reference/vision_conformance.py with
#      --plugin libeh-llama-cuda.so (against transformers, as it runs for
#      cpu-reference).
#
#   scripts/device-vision.sh BUILD_DIR
# Environment: MODELS_DIR (default /dev/shm/eh), OUT (default /tmp/vision-out),
# LC (default /tmp/lc), IMAGES (default 4).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/vision-out}
mkdir -p "$out"
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || echo unknown)"

if [ "${TESTS:-1}" = 1 ]; then
  "$build/bin/eh_cuda_vision_tests" 2>&1 | tee "$out/vision_tests.log" |
    grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|\[vision-(gpu|flash)\]|Failure|Expected|Which is|error' | head -60
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # eh-plugin-check's embd_spans (rows used, used once, checked; a grid span
  # taken, an uneven one refused) on the tiny vision model.
  tiny="$out/tiny-gemma-3-vision.gguf"
  "$build/bin/engine-host" forge --like tiny-gemma-3-vision-q4_k_m --out "$tiny" --mmproj-out "$out/tiny-mmproj.gguf" \
    > "$out/forge_tiny.log" 2>&1 || { echo "tiny forge failed"; tail -3 "$out/forge_tiny.log"; status=1; }
  "$build/bin/eh-plugin-check" "$build/plugins/libeh-llama-cuda.so" --model "$tiny" --only embd_spans \
    > "$out/plugin_check.log" 2>&1
  rc=$?
  tail -5 "$out/plugin_check.log"
  echo "eh-plugin-check embd_spans llama-cuda: exit $rc"
  [ $rc = 0 ] || status=1
  # (its forge reads the Gemma stand-in vocabulary from the shared test data:
  # without it the server cannot tokenize the chats and exits 4)
  [ -f ../shared/testdata/tokenizers/phi-3-mini/tokenizer.json ] ||
    echo "warning: no ../shared/testdata/tokenizers/phi-3-mini/tokenizer.json (stage the test data)"
  python3 tests/e2e/vision_gpu_test.py "$build/bin/engine-host" "$build/plugins" > "$out/vision_e2e.log" 2>&1
  rc=$?
  grep -E '^(PASS|FAIL)|\[vision-gpu-e2e\]' "$out/vision_e2e.log" | head -40
  [ $rc = 0 ] || tail -40 "$out/vision_e2e.log"
  echo "e2e.vision_gpu: exit $rc"
  [ $rc = 0 ] || status=1
fi

profile=${PROFILE:-gemma-3-4b-it-vision-q4_k_m}
models=${MODELS_DIR:-/dev/shm/eh}
model="$models/$profile.gguf"
mmproj="$models/$profile-mmproj.gguf"
if [ "${BENCH:-0}" = 1 ]; then
  mkdir -p "$models"
  if [ ! -s "$model" ] || [ ! -s "$mmproj" ]; then
    "$build/bin/engine-host" forge --like "$profile" --out "$model" --mmproj-out "$mmproj" > "$out/forge.log" 2>&1 ||
      { echo "$profile: forge failed"; tail -3 "$out/forge.log"; status=1; }
  fi
  echo "== engine-host (llama-cuda) on $profile"
  EH_VISION_BENCH_MODEL="$model" EH_VISION_BENCH_MMPROJ="$mmproj" "$build/bin/eh_cuda_vision_tests" \
    --gtest_filter='VisionGpuBench.*' 2>&1 | tee "$out/bench_eh.log" | grep -E '\[vision-bench\]|FAILED|Failure|error'
  lc=${LC:-/tmp/lc}
  if [ -x "$lc/llama-server" ]; then
    echo "== llama.cpp (llama-server --mmproj) on $profile"
    port=18391
    LD_LIBRARY_PATH="$lc" "$lc/llama-server" -m "$model" --mmproj "$mmproj" -ngl 99 -c 4096 -np 1 --port $port \
      > "$out/llama_server.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
      kill -0 $pid 2> /dev/null || break
      sleep 0.5
    done
    for i in $(seq "${IMAGES:-4}"); do
      python3 - "$i" > "$out/req.json" << 'PY'
import base64, json, random, struct, sys, zlib
w = h = 896
rng = random.Random(int(sys.argv[1]))
raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * w)) for _ in range(h))
def chunk(k, d):
    return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d) & 0xFFFFFFFF)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
      chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
url = "data:image/png;base64," + base64.b64encode(png).decode()
print(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "What is this?"}]}],
                  "max_tokens": 1, "temperature": 0}))
PY
      curl -s -o /dev/null -w "llama-server image $i: HTTP %{http_code}, %{time_total} s\n" \
        -H 'Content-Type: application/json' --data-binary @"$out/req.json" "http://127.0.0.1:$port/v1/chat/completions"
    done
    kill $pid 2> /dev/null
    wait $pid 2> /dev/null
    grep -E 'slice encoded in|image decoded|error' "$out/llama_server.log" | head -20
  else
    echo "llama.cpp not unpacked in $lc: its side skipped"
  fi
fi

if [ "${CONFORMANCE:-0}" = 1 ]; then
  src=${LLAMA_CPP_SRC:-/tmp/lcsrc}
  python3 tests/reference/vision_conformance.py --llama-cpp "$src" --dump "$build/bin/eh_vision_dump" \
    --tokenizer "$(pwd)/../shared/testdata/tokenizers/gpt2" --plugin "$build/plugins/libeh-llama-cuda.so" \
    --out "$out/conformance" > "$out/conformance.log" 2>&1
  rc=$?
  tail -30 "$out/conformance.log"
  echo "vision_conformance.py (llama-cuda): exit $rc"
  [ $rc = 0 ] || status=1
fi
exit $status
