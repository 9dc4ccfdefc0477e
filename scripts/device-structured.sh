#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh: decode speed with a
# JSON schema (response_format, enforced by the token mask through the
# batched step) against the same requests without one, on the forged
# Qwen2.5-0.5B Q4_K_M, with loadgen.py at 1 and 16 clients. Around each
# level it reads /metrics and prints where the time went: the engine's step
# calls (ms per step), the host's mask and matcher work (ms per step), and
# tokens per request (a schema's answer may end before max_tokens). Then the
# same comparison streamed with `engine-host loadgen --stream`, whose TPOT
# (time per output token after the first) is the decode rate a client sees
# whatever length the answers have, and last `engine-host bench` (prefill
# 512, decode 128, one sequence through the batched step) after the server
# stops: the plugin's batch-1 decode rate beside the server's one-client TPOT.
# SCHEMA_FILE names another schema than the 3-property one (e.g.
# host/constrain/bench/schemas/order.json: $refs, oneOf, patterns, formats,
# bounds), sent the same way with strict false.
#   OUT=... [LOADGEN=.../loadgen.py] [ROUNDS=3] [SCHEMA_FILE=...] scripts/device-structured.sh BUILD_DIR [LEVELS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
levels=${2:-1,16}
out=${OUT:-/tmp/eh-structured}
loadgen=${LOADGEN:-$(cd ../shared/peers && pwd)/loadgen.py}
mkdir -p "$out" /tmp/eh-models
f=/tmp/eh-models/qwen.gguf
"$build/bin/engine-host" forge --like qwen2.5-0.5b-instruct-q4_k_m --out "$f" -q
"$build/bin/engine-host" --plugins "$build/plugins" --port 18700 --log-format text --log-level warn --model "$f" \
  --ctx-size 4096 > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf localhost:18700/health > /dev/null && break; kill -0 $pid 2>/dev/null || { echo "the server exited:"; tail -5 "$out/serve.log"; exit 1; }; sleep 0.5; done
schema='{"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"],"additionalProperties":false}}}}'
if [ -n "${SCHEMA_FILE:-}" ]; then
  schema=$(python3 -c 'import json,sys; print(json.dumps({"response_format": {"type": "json_schema", "json_schema":
    {"name": "s", "strict": False, "schema": json.load(open(sys.argv[1]))}}}, separators=(",", ":")))' "$SCHEMA_FILE") || exit 1
fi
metrics() {  # steps, step seconds, constraint seconds, generated tokens
  curl -s localhost:18700/metrics | awk '/^eh_engine_steps_total /{a=$2} /^eh_engine_step_seconds_total /{b=$2}
    /^eh_constraint_seconds_total /{c=$2} /^eh_generated_tokens_total /{d=$2} END{print a, b, c, d}'
}
level() {  # LABEL CLIENTS [EXTRA]
  local before after
  before=$(metrics)
  python3 "$loadgen" http://127.0.0.1:18700 "$1" --levels "$2" ${3:+--extra "$3"} | tee -a "$out/structured.jsonl"
  after=$(metrics)
  echo "$before $after" | awk -v l="$1" -v c="$2" '{s=$5-$1; printf "{\"split\": \"%s\", \"concurrency\": %s, \"steps\": %d, \"engine_ms_per_step\": %.4f, \"constraint_ms_per_step\": %.4f, \"tokens\": %d}\n",
    l, c, s, s ? 1000*($6-$2)/s : 0, s ? 1000*($7-$3)/s : 0, $8-$4}' | tee -a "$out/structured.jsonl"
}
streamed() {  # LABEL CLIENTS [EXTRA]
  echo "{\"split\": \"$1-stream\", \"result\": $("$build/bin/engine-host" loadgen --url http://127.0.0.1:18700 \
    --levels "$2" -n 128 --requests-per-client 4 --stream --json ${3:+--extra "$3"} | tr -d '\n ')}" |
    tee -a "$out/structured.jsonl"
}
for run in $(seq 1 "${ROUNDS:-3}"); do
  for c in ${levels//,/ }; do
    level plain "$c"
    level json_schema "$c" "$schema"
    streamed plain "$c"
    streamed json_schema "$c" "$schema"
  done
done
# One chat answer with the schema: JSON matching it when it ends by itself (finish_reason "stop"), a prefix of such JSON when max_tokens cuts it.
curl -s localhost:18700/v1/chat/completions -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":200,${schema:1:-1}}" | tee "$out/sample.json" | head -c 600; echo
kill $pid; wait $pid 2>/dev/null
"$build/bin/engine-host" bench --plugins "$build/plugins" --model "$f" -p 512 -n 128 -r 3 | tee "$out/bench.txt"
