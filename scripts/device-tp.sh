#!/usr/bin/env bash
# Tensor parallelism in the one-GPU shard mode on the GPU machine (issue 53).
# For each forged model: bench one rank against --gpus 0,0 (and 0,0,0,0),
# then serve it with --gpus 0,0 and with one rank and compare /health's
# devices and a greedy completion. The shard mode runs every rank on the one
# GPU, so its speed says what the split costs in launches, not what two GPUs
# would give.
#
#   scripts/device-tp.sh [BUILD_DIR]      (default: build)
#
# Environment: OUT (default ./tp-out), MODELS_DIR (default /tmp/eh-forged),
# PROFILES (default: llama-3.1-8b-instruct-q4_k_m qwen2.5-0.5b-instruct-q4_k_m),
# BENCH_ARGS (default -p 512 -n 128 -r 3).
set -uo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin/engine-host"
PLUGINS="$BUILD/plugins"
OUT=${OUT:-$PWD/tp-out}
MODELS_DIR=${MODELS_DIR:-${TMPDIR:-/tmp}/eh-forged}
PROFILES=${PROFILES:-"llama-3.1-8b-instruct-q4_k_m qwen2.5-0.5b-instruct-q4_k_m"}
BENCH_ARGS=${BENCH_ARGS:-"-p 512 -n 128 -r 3"}
mkdir -p "$OUT" "$MODELS_DIR"
[ -x "$BIN" ] || { echo "device-tp: $BIN not found" >&2; exit 2; }
for c in "${EH_TESTDATA_DIR:-}" ../shared/testdata shared/testdata; do
  if [ -n "$c" ] && [ -d "$c" ]; then export EH_TESTDATA_DIR=$(cd "$c" && pwd); break; fi
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'

# serve_once MODEL NAME ARGS...: serves, prints /health's devices and a
# greedy completion's text into $OUT/NAME.*, stops.
serve_once() {
  local model=$1 name=$2 log="$OUT/$2.serve.log"
  shift 2
  "$BIN" --model "$model" --plugins "$PLUGINS" --port 0 "$@" >"$log" 2>&1 &
  local pid=$! port=""
  for _ in $(seq 600); do
    port=$(grep -o '"event":"ready".*"uri":"http://127.0.0.1:[0-9]*"' "$log" | grep -o '[0-9]*"$' | tr -d '"')
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$port" ]; then echo "$name: did not start: $(grep -m2 '"error"' "$log")"; kill $pid 2>/dev/null; wait $pid; return 1; fi
  curl -s "http://127.0.0.1:$port/health" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("devices", json.dumps(j.get("devices")), "vram", j.get("vram_bytes_used"))' > "$OUT/$name.health"
  curl -s "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt":"Once upon a time there was","max_tokens":48,"temperature":0}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' > "$OUT/$name.text" 2>&1
  curl -s "http://127.0.0.1:$port/metrics" | grep eh_model_device_info > "$OUT/$name.metrics"
  kill -TERM $pid; wait $pid
  echo "$name: $(cat "$OUT/$name.health")"
}

for prof in $PROFILES; do
  model="$MODELS_DIR/$prof.gguf"
  [ -s "$model" ] || "$BIN" forge --like "$prof" --out "$model" 2>&1 | tail -1
  for gpus in "" "0,0" "0,0,0,0"; do
    # shellcheck disable=SC2086
    "$BIN" bench --plugins "$PLUGINS" --plugin llama-cuda --model "$model" $BENCH_ARGS ${gpus:+--gpus $gpus} --json \
      > "$OUT/$prof.bench${gpus:+.$gpus}.json" 2>"$OUT/$prof.bench${gpus:+.$gpus}.err"
    python3 - "$OUT/$prof.bench${gpus:+.$gpus}.json" "$prof" "${gpus:-one rank}" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["results"][0]
except Exception as e:
    print(sys.argv[2], sys.argv[3], "bench failed:", e); sys.exit(0)
if r.get("ok"):
    print("%s %-9s decode %.1f tok/s  prefill %.0f tok/s  device %.2f GiB" % (sys.argv[2], sys.argv[3],
          r["decode_tokens_per_s"], r["prefill_tokens_per_s"], r["peak_device_bytes"] / 2**30))
else:
    print(sys.argv[2], sys.argv[3], "refused:", r.get("error"))
PY
  done
  serve_once "$model" "$prof.tp1" && serve_once "$model" "$prof.tp2" --gpus 0,0 &&
    if cmp -s "$OUT/$prof.tp1.text" "$OUT/$prof.tp2.text"; then echo "$prof: greedy completion the same with --gpus 0,0"
    else echo "$prof: greedy completions differ:"; head -c 400 "$OUT/$prof.tp1.text"; echo " | "; head -c 400 "$OUT/$prof.tp2.text"; echo; fi
done
