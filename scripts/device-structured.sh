#!/usr/bin/env bash
# On the GPU machine, after scripts/device-unpack.sh: decode speed with a
# JSON schema (response_format, enforced by the token mask through the
# batched step) against the same requests without one, on the forged
# Qwen2.5-0.5B Q4_K_M, with ../shared/peers/loadgen.py at 1 and 16 clients.
#   OUT=... scripts/device-structured.sh BUILD_DIR [LEVELS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
levels=${2:-1,16}
out=${OUT:-/tmp/eh-structured}
loadgen=$(cd ../shared/peers && pwd)/loadgen.py
mkdir -p "$out" /tmp/eh-models
f=/tmp/eh-models/qwen.gguf
"$build/bin/engine-host" forge --like qwen2.5-0.5b-instruct-q4_k_m --out "$f" -q
"$build/bin/engine-host" --plugins "$build/plugins" --port 18700 --log-format text --log-level warn --model "$f" \
  --ctx-size 4096 > "$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do curl -sf localhost:18700/health > /dev/null && break; sleep 0.5; done
schema='{"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"],"additionalProperties":false}}}}'
for run in 1 2; do
  python3 "$loadgen" http://127.0.0.1:18700 "plain" --levels "$levels" | tee -a "$out/structured.jsonl"
  python3 "$loadgen" http://127.0.0.1:18700 "json_schema" --levels "$levels" --extra "$schema" | tee -a "$out/structured.jsonl"
done
# One answer with the schema, to show it parses.
curl -s localhost:18700/v1/chat/completions -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":200,${schema:1:-1}}" | tee "$out/sample.json" | head -c 600; echo
kill $pid; wait $pid 2>/dev/null
