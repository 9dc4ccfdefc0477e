#!/usr/bin/env bash
# On the GPU machine: serve --engine-process with a CUDA plugin, then
#   1. the same greedy completion in the engine process and in process;
#   2. a streaming request whose engine process gets SIGSEGV mid-stream: its
#      last events, the time until /health is healthy again, and the next
#      request's text;
#   3. loadgen at 1 and 16 clients in both modes (the process boundary's cost);
#   4. no engine process left after SIGTERM, and the GPU memory it held freed.
#
#   scripts/device-engine-process.sh BUILD_DIR PROFILE LOADGEN_PY
# (after device-unpack.sh; MODELS_DIR, default /dev/shm/eh)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
profile=${2:-qwen2.5-0.5b-instruct-q4_k_m}
loadgen=${3:-}
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
mkdir -p "$models"
model="$models/$profile.gguf"
[ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" | tail -1
port=18700
base="http://127.0.0.1:$port"
req='{"prompt":"The capital of France is","max_tokens":24,"temperature":0}'

start() {  # start serve with extra args, wait until healthy
  "$eh" serve --plugins "$build/plugins" --model "$model" --port $port --ctx-size 4096 "$@" > /tmp/serve.log 2>&1 &
  serve_pid=$!
  for _ in $(seq 1 120); do
    curl -sf "$base/health" 2>/dev/null | grep -q '"status": *"healthy"' && return 0
    sleep 0.5
  done
  echo "serve did not become healthy:"; tail -20 /tmp/serve.log; return 1
}
stop() {
  kill -TERM "$serve_pid"; wait "$serve_pid"; echo "serve exit: $?"
}
text() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'; }

echo "== in process"
start || exit 1
inproc=$(curl -s -H 'Content-Type: application/json' -d "$req" "$base/v1/completions" | text)
[ -n "$loadgen" ] && python3 "$loadgen" "$base" in-process --levels 1,16 2>&1 | tail -4
stop

echo "== engine process"
start --engine-process || exit 1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
curl -s "$base/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); print("health:", h.get("status"), h.get("engine"), "resident", h.get("resident"))'
first=$(curl -s -H 'Content-Type: application/json' -d "$req" "$base/v1/completions" | text)
[ "$first" = "$inproc" ] && echo "same greedy text as in process" || echo "DIFFERENT: '$first' vs '$inproc'"
[ -n "$loadgen" ] && python3 "$loadgen" "$base" engine-process --levels 1,16 2>&1 | tail -4

echo "== SIGSEGV to the engine process mid-stream"
curl -sN -H 'Content-Type: application/json' \
  -d '{"prompt":"Once","max_tokens":3000,"temperature":0,"stream":true}' "$base/v1/completions" > /tmp/stream.txt &
curl_pid=$!
child=$(curl -s "$base/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["engine"]["process"])')
sleep 0.4
t0=$(date +%s.%N)
kill -SEGV "$child"
wait $curl_pid
echo "stream's last lines:"; tail -c 400 /tmp/stream.txt; echo
for _ in $(seq 1 240); do
  curl -sf "$base/health" 2>/dev/null | grep -q '"status": *"healthy"' && break
  sleep 0.25
done
echo "healthy again after $(python3 -c "import time; print(round(time.time() - $t0, 2))") s"
curl -s "$base/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); print("health:", h.get("status"), h.get("engine"))'
again=$(curl -s -H 'Content-Type: application/json' -d "$req" "$base/v1/completions" | text)
[ "$again" = "$inproc" ] && echo "after the restart: same greedy text" || echo "DIFFERENT after restart: '$again'"
curl -s "$base/metrics" | grep -E '^eh_engine_restarts_total'
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
stop
sleep 1
left=$(ps -eo args | grep -c '[e]ngine-worker')
echo "engine processes left: $left"
nvidia-smi --query-gpu=memory.used --format=csv,noheader
grep -E 'engine_restart|ENGINE_CRASHED|engine_restarted' /tmp/serve.log | head -5
