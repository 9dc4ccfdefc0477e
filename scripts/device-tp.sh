#!/usr/bin/env bash
# Tensor parallelism on the GPU machine (issue 53), in one call.
#
# Part 1, any machine: for each of $PROFILES, `bench` one rank against the
# shard mode (--gpus 0,0: the ranks one after another on one stream), the
# streams mode on one GPU (--gpus 0,0 with "tensor_parallel":"streams": each
# rank on its own stream, the distinct-GPU code path) and, where
# `nvidia-smi -L` lists them, 2 and 4 distinct GPUs; then serve one rank and
# each split and compare /health's devices, /metrics' device lines and a
# greedy completion.
# Part 2, 2 or more GPUs: $BIG (a forged Llama-3.3-70B-class Q4_K_M):
# batch-1 decode on 1 (where it fits), 2 and 4 GPUs, 64 clients through the
# server (../shared/peers/loadgen.py, as ../shared/peers/README.md
# measures) at each, and llama.cpp's -sm layer on the same GPUs in the same
# call where its build is unpacked in $LC (llama-bench and llama-server).
#
#   scripts/device-tp.sh [BUILD_DIR]      (default: build)
#
# Environment: OUT (default ./tp-out), MODELS_DIR (default /tmp/eh-forged),
# PROFILES (default: llama-3.1-8b-instruct-q4_k_m qwen2.5-0.5b-instruct-q4_k_m),
# BENCH_ARGS (default -p 512 -n 128 -r 3), BIG (default
# llama-3.3-70b-instruct-q4_k_m), LEVELS (default 1,64), LC (default /tmp/lc),
# LOADGEN (default ../shared/peers/loadgen.py), SERVE (default 1; 0: part 1
# benches only, no servers).
set -uo pipefail
BUILD=${1:-build}
BIN="$BUILD/bin/engine-host"
PLUGINS="$BUILD/plugins"
OUT=${OUT:-$PWD/tp-out}
MODELS_DIR=${MODELS_DIR:-${TMPDIR:-/tmp}/eh-forged}
PROFILES=${PROFILES:-"llama-3.1-8b-instruct-q4_k_m qwen2.5-0.5b-instruct-q4_k_m"}
BENCH_ARGS=${BENCH_ARGS:-"-p 512 -n 128 -r 3"}
BIG=${BIG:-llama-3.3-70b-instruct-q4_k_m}
LEVELS=${LEVELS:-1,64}
LC=${LC:-/tmp/lc}
LOADGEN=${LOADGEN:-$(cd "$(dirname "$0")/../../shared/peers" 2>/dev/null && pwd)/loadgen.py}
# shellcheck disable=SC2089  # (a JSON word, split on spaces only)
STREAMS='{"tensor_parallel":"streams"}'
SERVE=${SERVE:-1}
mkdir -p "$OUT" "$MODELS_DIR"
[ -x "$BIN" ] || { echo "device-tp: $BIN not found" >&2; exit 2; }
for c in "${EH_TESTDATA_DIR:-}" ../shared/testdata shared/testdata; do
  if [ -n "$c" ] && [ -d "$c" ]; then export EH_TESTDATA_DIR=$(cd "$c" && pwd); break; fi
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "gpus: $NGPU"
# The splits of part 1: NAME GPUS ENGINE_OPTIONS ("-": none).
SPLITS="shard2 0,0 - streams2 0,0 $STREAMS streams4 0,0,0,0 $STREAMS"
[ "$NGPU" -ge 2 ] && SPLITS="$SPLITS gpus2 0,1 -"
[ "$NGPU" -ge 4 ] && SPLITS="$SPLITS gpus4 0,1,2,3 -"

forge() {  # PROFILE -> the file's path (forged once)
  local model="$MODELS_DIR/$1.gguf"
  [ -s "$model" ] || "$BIN" forge --like "$1" --out "$model" -q >&2
  echo "$model"
}

# bench_one MODEL PROF LABEL GPUS OPTIONS: one bench line.
bench_one() {
  local model=$1 prof=$2 label=$3 gpus=$4 opts=$5 f="$OUT/$2.bench.$3"
  # shellcheck disable=SC2086
  "$BIN" bench --plugins "$PLUGINS" --plugin llama-cuda --model "$model" $BENCH_ARGS ${gpus:+--gpus $gpus} \
    ${opts:+--engine-options "$opts"} --json > "$f.json" 2> "$f.err"
  python3 - "$f.json" "$prof" "$label" <<'PY'
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
}

# serve NAME MODEL ARGS...: starts a server into $OUT/NAME.serve.log and
# sets PORT and PID; returns 1 (stopped) when it does not come up.
serve() {
  local name=$1 model=$2 log="$OUT/$1.serve.log"
  shift 2
  "$BIN" --model "$model" --plugins "$PLUGINS" --port 0 "$@" >"$log" 2>&1 &
  PID=$! PORT=""
  for _ in $(seq 1200); do
    PORT=$(grep -o '"event":"ready".*"uri":"http://127.0.0.1:[0-9]*"' "$log" | grep -o '[0-9]*"$' | tr -d '"')
    [ -n "$PORT" ] && break
    kill -0 $PID 2>/dev/null || break
    sleep 0.5
  done
  if [ -z "$PORT" ]; then echo "$name: did not start: $(grep -m2 '"error"' "$log")"; kill $PID 2>/dev/null; wait $PID; return 1; fi
  grep -o '"event":"ready".*' "$log" | head -c 600 > "$OUT/$name.ready"
}
stop() { kill -TERM $PID; wait $PID; }

# check NAME: /health's devices, /metrics' device lines, a greedy completion.
check() {
  local name=$1
  curl -s "http://127.0.0.1:$PORT/health" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("devices", json.dumps(j.get("devices")), "vram", j.get("vram_bytes_used"))' > "$OUT/$name.health"
  curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt":"Once upon a time there was","max_tokens":48,"temperature":0}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' > "$OUT/$name.text" 2>&1
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E 'eh_model_device_info|device_bytes' > "$OUT/$name.metrics"
  echo "$name: $(cat "$OUT/$name.health"); metrics: $(grep -c . "$OUT/$name.metrics") device lines"
}

# ---- part 1
for prof in $PROFILES; do
  model=$(forge "$prof")
  bench_one "$model" "$prof" "one-rank" "" ""
  # shellcheck disable=SC2086,SC2090
  set -- $SPLITS
  while [ $# -ge 3 ]; do
    opts=$3; [ "$opts" = - ] && opts=""
    bench_one "$model" "$prof" "$1" "$2" "$opts"
    shift 3
  done
  [ "$SERVE" = 0 ] && continue
  serve "$prof.tp1" "$model" && { check "$prof.tp1"; stop; }
  # shellcheck disable=SC2086,SC2090
  set -- $SPLITS
  while [ $# -ge 3 ]; do
    name=$1 gpus=$2 opts=$3
    shift 3
    [ "$opts" = - ] && opts=""
    serve "$prof.$name" "$model" --gpus "$gpus" ${opts:+--engine-options "$opts"} || continue
    check "$prof.$name"
    stop
    if cmp -s "$OUT/$prof.tp1.text" "$OUT/$prof.$name.text"; then echo "$prof: greedy completion the same with $name"
    else echo "$prof: greedy completions differ ($name):"; head -c 300 "$OUT/$prof.tp1.text"; echo " | "; head -c 300 "$OUT/$prof.$name.text"; echo; fi
  done
done

# ---- part 2: the big model over distinct GPUs
if [ "$NGPU" -lt 2 ]; then
  echo "part 2 ($BIG over 2 and 4 GPUs, llama.cpp -sm layer beside): skipped, $NGPU GPU(s)"
  exit 0
fi
model=$(forge "$BIG")
ls -la "$model" | awk '{print "big model:", $NF, $5 / 2^30, "GiB"}'
SETS="0"
[ "$NGPU" -ge 2 ] && SETS="$SETS 0,1"
[ "$NGPU" -ge 4 ] && SETS="$SETS 0,1,2,3"
for gpus in $SETS; do
  n=$(echo "$gpus" | tr ',' '\n' | grep -c .)
  label="gpus$n"
  # batch-1 decode (one rank: only where the model fits one GPU)
  if [ "$n" = 1 ]; then bench_one "$model" "$BIG" "$label" "" ""; else bench_one "$model" "$BIG" "$label" "$gpus" ""; fi
  # 64 clients through the server
  if [ "$n" = 1 ]; then serve "$BIG.$label" "$model" --ctx-size 4096; else serve "$BIG.$label" "$model" --ctx-size 4096 --gpus "$gpus"; fi &&
    { check "$BIG.$label"; [ -f "$LOADGEN" ] && python3 "$LOADGEN" "http://127.0.0.1:$PORT" "engine-host $BIG $label" --levels "$LEVELS" | tee -a "$OUT/load.jsonl"; stop; }
  # llama.cpp splitting by layers over the same GPUs
  if [ -x "$LC/llama-bench" ]; then
    CUDA_VISIBLE_DEVICES=$gpus LD_LIBRARY_PATH=$LC "$LC/llama-bench" -m "$model" $BENCH_ARGS -ngl 99 -fa 1 -sm layer -o json \
      > "$OUT/$BIG.llama-bench.$label.json" 2> "$OUT/$BIG.llama-bench.$label.err"
    python3 - "$OUT/$BIG.llama-bench.$label.json" "$label" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))
    print("llama.cpp -sm layer", sys.argv[2], "; ".join("%s %.1f tok/s" % ("pp%d" % r["n_prompt"] if r["n_prompt"] else "tg%d" % r["n_gen"], r["avg_ts"]) for r in rows))
except Exception as e:
    print("llama.cpp -sm layer", sys.argv[2], "failed:", e)
PY
  fi
  if [ -x "$LC/llama-server" ] && [ -f "$LOADGEN" ]; then
    CUDA_VISIBLE_DEVICES=$gpus LD_LIBRARY_PATH=$LC "$LC/llama-server" -m "$model" -ngl 99 -fa on -sm layer -np 64 -c 65536 \
      --metrics --port 18711 > "$OUT/$BIG.llama-server.$label.log" 2>&1 &
    lpid=$!
    for _ in $(seq 1200); do curl -sf localhost:18711/health > /dev/null && break; sleep 0.5; done
    python3 "$LOADGEN" http://127.0.0.1:18711 "llama-server -sm layer $BIG $label" --levels "$LEVELS" --llama-native \
      --count-metric llamacpp:tokens_predicted_total | tee -a "$OUT/load.jsonl"
    kill $lpid; wait $lpid 2>/dev/null
  fi
done
