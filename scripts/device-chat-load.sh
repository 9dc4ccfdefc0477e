#!/usr/bin/env bash
# On the GPU machine: issue 47's chat-like load (`engine-host loadgen
# --workload chat`: prompts of ~200-4,000 tokens, half behind a shared
# 1,000-word preamble, 100-200-token answers, ignore_eos, streamed) against
# engine-host serve for each --prefill-chunk-tokens in $CHUNKS, then against
# llama-server -np 64 when $LC holds it, each server on its own in turn on the
# same forged file. One summary line per run; the JSON in $OUT.
#   [CHUNKS="256 512 1024 2048"] [LEVELS=64] [LOADGEN_ARGS=...] [SERVE_ARGS=...] \
#     scripts/device-chat-load.sh BUILD_DIR "PROFILE ..."
# (after device-unpack.sh; MODELS_DIR, default /dev/shm/eh; OUT, default
# /tmp/chat-load; LC, default /tmp/lc, holds llama.cpp's build of ../shared/peers/)
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
eh="$build/bin/engine-host"
models=${MODELS_DIR:-/dev/shm/eh}
out=${OUT:-/tmp/chat-load}
lc=${LC:-/tmp/lc}
chunks=${CHUNKS:-512}
levels=${LEVELS:-64}
# 4 requests a client: the first ones of a level compute the preamble, later ones reuse it.
loadgen_args=${LOADGEN_ARGS:---requests-per-client 4}
ctx=${CTX:-5120}  # the longest request: 1,000 + 3,000 words, 200 tokens of answer
mkdir -p "$models" "$out"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/gpu: /'
echo "commit: $(cat "$build/COMMIT" 2>/dev/null || git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null)"
port=18730
up() {  # pid
  for _ in $(seq 1 480); do
    kill -0 "$1" 2>/dev/null || return 1
    curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"status": *"\(healthy\|ok\)"' && return 0
    sleep 0.5
  done
  return 1
}
summary() {  # label json
  python3 - "$1" "$2" <<'EOF'
import json, sys
label, path = sys.argv[1:3]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"{label}: no result ({e})")
    sys.exit()
for l in d["levels"]:
    ms = lambda k: 1000 * l.get(k, 0)
    print(f"{label}, {l['clients']} clients: {l['tokens_per_s']:.0f} output tok/s, TTFT p50/p99 "
          f"{ms('ttft_p50_s'):.0f}/{ms('ttft_p99_s'):.0f} ms, TPOT p50/p95/p99 {ms('tpot_p50_s'):.1f}/"
          f"{ms('tpot_p95_s'):.1f}/{ms('tpot_p99_s'):.1f} ms, {l['requests']} requests, {l['failed']} failed, "
          f"prompt tokens {l.get('prompt_tokens', 0)} ({l.get('cached_prompt_tokens', 0)} cached)"
          + (f", first error: {l['first_error']}" if l.get("first_error") else ""))
EOF
}
# measure PID TAG LABEL WHAT LOG: once the server PID answers, the chat load
# against it into $out/$profile.TAG.json and its summary line; then stops it.
measure() {
  local pid=$1 tag=$2 label=$3 what=$4 log=$5
  if up "$pid"; then
    # shellcheck disable=SC2086
    "$eh" loadgen --url "http://127.0.0.1:$port" --workload chat --levels "$levels" $loadgen_args --json \
      > "$out/$profile.$tag.json" 2> "$out/$profile.$tag.err"
    summary "$label" "$out/$profile.$tag.json"
  else
    echo "$profile: $what did not come up"; tail -3 "$log"
  fi
  kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}
for profile in ${2:-gpt-oss-20b-mxfp4}; do
  model="$models/$profile.gguf"
  [ -s "$model" ] || "$eh" forge --like "$profile" --out "$model" > "$out/$profile.forge.log" 2>&1 ||
    { echo "$profile: forge failed"; continue; }
  for chunk in $chunks; do
    # shellcheck disable=SC2086
    "$eh" serve --plugins "$build/plugins" --model "$model" --port $port --ctx-size "$ctx" \
      --prefill-chunk-tokens "$chunk" ${SERVE_ARGS:-} > "$out/$profile.serve$chunk.log" 2>&1 &
    measure $! "eh$chunk" "$profile engine-host --prefill-chunk-tokens $chunk" serve "$out/$profile.serve$chunk.log"
  done
  if [ -x "$lc/llama-server" ]; then
    # -c is shared by the 64 slots: each gets $ctx.
    LD_LIBRARY_PATH=$lc "$lc/llama-server" -m "$model" -ngl 99 -fa on -np 64 -c $((64 * ctx)) --port $port \
      > "$out/$profile.lc.log" 2>&1 &
    measure $! lc "$profile llama-server -np 64" llama-server "$out/$profile.lc.log"
  fi
done
