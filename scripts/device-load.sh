#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh: throughput under load
# through the HTTP API with `engine-host loadgen`, for
#   - llama-cuda serving forged Qwen2.5-0.5B Q4_K_M (1, 4, 16 clients),
#   - cpu-reference serving models/tinytales.gguf, batched (--parallel 64)
#     and one request at a time (--parallel 1),
# and the multi-turn chat's time to first token on cpu-reference with and
# without prefix reuse. Results go to $OUT (JSON and logs).
#   OUT=... scripts/device-load.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
out=${OUT:-/tmp/eh-load}
mkdir -p "$out" /tmp/eh-models
eh="$build/bin/engine-host"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" || true
cat "$build/COMMIT" >> "$out/gpu.txt" 2>/dev/null || true

# The CPU runs use a folder holding the cpu-reference plugin alone (on a GPU
# machine llama-cuda would otherwise be chosen for a llama model).
mkdir -p /tmp/eh-cpu-plugins
cp "$build"/plugins/libeh-cpu-reference.so "$build"/plugins/cpu-reference.manifest.json /tmp/eh-cpu-plugins/
plugins="$build/plugins"
serve() {  # port, log name, args...
  local port=$1 name=$2; shift 2
  "$eh" --plugins "$plugins" --port "$port" --log-format text --log-level warn "$@" > "$out/$name.log" 2>&1 &
  echo $! > /tmp/eh-serve.pid
  for _ in $(seq 1 240); do curl -sf "localhost:$port/health" > /dev/null && return 0; sleep 0.5; done
  echo "server $name did not come up"; tail -20 "$out/$name.log"; return 1
}
stop() { kill "$(cat /tmp/eh-serve.pid)" 2>/dev/null || true; wait "$(cat /tmp/eh-serve.pid)" 2>/dev/null || true; }

"$eh" forge --like qwen2.5-0.5b-instruct-q4_k_m --out /tmp/eh-models/qwen.gguf -q
"$eh" forge --like tiny-qwen2.5-q4_k_m --out /tmp/eh-models/tiny-qwen.gguf -q

serve 18700 qwen-cuda --model /tmp/eh-models/qwen.gguf --ctx-size 4096
curl -s localhost:18700/health > "$out/qwen-cuda-health.json"
"$eh" loadgen --url http://127.0.0.1:18700 --levels 1,4,16 -n 128 --json > "$out/qwen-cuda-load.json"
stop

plugins=/tmp/eh-cpu-plugins
serve 18701 tinytales-cpu64 --model models/tinytales.gguf --threads 16
"$eh" loadgen --url http://127.0.0.1:18701 --levels 1,4,16,64 -n 64 --json > "$out/tinytales-parallel64.json"
stop
serve 18702 tinytales-cpu1 --model models/tinytales.gguf --threads 16 --parallel 1
"$eh" loadgen --url http://127.0.0.1:18702 --levels 1,16 -n 64 --json > "$out/tinytales-parallel1.json"
stop

serve 18703 multiturn-cache --model /tmp/eh-models/tiny-qwen.gguf --threads 16 --ctx-size 8192
python3 scripts/multiturn_ttft.py --url http://127.0.0.1:18703 --turns 10 --words 300 > "$out/multiturn-cache.txt"
stop
serve 18704 multiturn-nocache --model /tmp/eh-models/tiny-qwen.gguf --threads 16 --ctx-size 8192 --no-prefix-cache
python3 scripts/multiturn_ttft.py --url http://127.0.0.1:18704 --turns 10 --words 300 > "$out/multiturn-nocache.txt"
stop
echo done
