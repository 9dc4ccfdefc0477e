#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh: one client's decode
# rate through the server with chained steps (ABI 1.3: step N+1 begins
# before the host reads N) against the same server with --no-chained-steps,
# and against `engine-host bench`'s one sequence through the step (no server),
# on a forged model (LIKE, a forge profile; default the Qwen2.5-0.5B
# Q4_K_M). Per round and setting: the streamed
# `engine-host loadgen` (TPOT: time per output token after the first) at
# LEVELS, then loadgen.py at the same levels; /metrics' chained-step count
# around them.
#   OUT=... [LOADGEN=.../loadgen.py] [ROUNDS=3] [LIKE=profile] scripts/device-chain.sh BUILD_DIR [LEVELS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
levels=${2:-1,16}
out=${OUT:-/tmp/eh-chain}
loadgen=${LOADGEN:-$(cd ../shared/peers && pwd)/loadgen.py}
mkdir -p "$out" /tmp/eh-models
like=${LIKE:-qwen2.5-0.5b-instruct-q4_k_m}
f=/tmp/eh-models/$like.gguf
[ -f "$f" ] || "$build/bin/engine-host" forge --like "$like" --out "$f" -q
serve() {  # EXTRA_FLAGS...
  "$build/bin/engine-host" --plugins "$build/plugins" --port 18710 --log-format text --log-level warn --model "$f" \
    --ctx-size 4096 "$@" > "$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 240); do curl -sf localhost:18710/health > /dev/null && return 0; kill -0 $pid 2>/dev/null || { tail -5 "$out/serve.log"; exit 1; }; sleep 0.5; done
}
chained() { curl -s localhost:18710/metrics | awk '/^eh_engine_chained_steps_total /{print $2}'; }
for run in $(seq 1 "${ROUNDS:-3}"); do
  for mode in chained plain; do
    if [ $mode = chained ]; then serve; else serve --no-chained-steps; fi
    for c in ${levels//,/ }; do
      echo "{\"mode\": \"$mode\", \"round\": $run, \"stream\": $("$build/bin/engine-host" loadgen --url http://127.0.0.1:18710 \
        --levels "$c" -n 128 --requests-per-client 4 --stream --json | tr -d '\n ')}" | tee -a "$out/chain.jsonl"
      python3 "$loadgen" http://127.0.0.1:18710 "$mode" --levels "$c" | tee -a "$out/chain.jsonl"
    done
    echo "{\"mode\": \"$mode\", \"round\": $run, \"chained_steps\": $(chained)}" | tee -a "$out/chain.jsonl"
    kill $pid; wait $pid 2>/dev/null
  done
done
"$build/bin/engine-host" bench --plugins "$build/plugins" --model "$f" -p 512 -n 128 -r 3 | tee "$out/bench.txt"
