#!/usr/bin/env bash
# On the GPU machine: aggregate throughput under load, engine-host beside
# llama-server, with ../shared/peers/loadgen.py and the commands of
# ../shared/peers/README.md, on the forged Qwen2.5-0.5B and Phi-3-mini
# Q4_K_M files. Needs scripts/device-unpack.sh run and llama.cpp's build
# unpacked in $LC (default /tmp/lc). Results (JSON lines) go to $OUT.
#   OUT=... [LOADGEN=.../loadgen.py] scripts/device-load-vs-llama.sh BUILD_DIR [LEVELS] [MODELS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
levels=${2:-1,4,16,64}
models=${3:-qwen2.5-0.5b-instruct-q4_k_m phi-3-mini-4k-instruct-q4_k_m}
out=${OUT:-/tmp/eh-vs}
lc=${LC:-/tmp/lc}
loadgen=${LOADGEN:-$(cd ../shared/peers && pwd)/loadgen.py}
eh="$build/bin/engine-host"
mkdir -p "$out" /tmp/eh-models
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
up() {  # port
  for _ in $(seq 1 240); do curl -sf "localhost:$1/health" > /dev/null && return 0; sleep 0.5; done
  return 1
}
for m in $models; do
  f=/tmp/eh-models/$m.gguf
  [ -f "$f" ] || "$eh" forge --like "$m" --out "$f" -q
  "$eh" --plugins "$build/plugins" --port 18700 --log-format text --log-level warn --model "$f" --ctx-size 4096 \
    > "$out/$m-eh.log" 2>&1 &
  pid=$!
  if up 18700; then
    python3 "$loadgen" http://127.0.0.1:18700 "engine-host $m" --levels "$levels" | tee -a "$out/load.jsonl"
  else
    echo "engine-host did not come up for $m"; tail -5 "$out/$m-eh.log"
  fi
  kill $pid; wait $pid 2>/dev/null
  if [ -x "$lc/llama-server" ]; then
    LD_LIBRARY_PATH=$lc "$lc/llama-server" -m "$f" -ngl 99 -fa on -np 64 -c 65536 --metrics --port 18701 \
      > "$out/$m-lc.log" 2>&1 &
    pid=$!
    if up 18701; then
      python3 "$loadgen" http://127.0.0.1:18701 "llama-server $m" --levels "$levels" --llama-native \
        --count-metric llamacpp:tokens_predicted_total | tee -a "$out/load.jsonl"
    else
      echo "llama-server did not come up for $m"; tail -5 "$out/$m-lc.log"
    fi
    kill $pid; wait $pid 2>/dev/null
  fi
done
