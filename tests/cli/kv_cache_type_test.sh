#!/usr/bin/env bash
# serve --kv-cache-type (issue 50), on the shipped model:
# - the CPU reference with f16, q8_0 and fp8 in the same --kv-cache-size-mb:
#   /health names the type, and q8_0 / fp8 hold about twice f16's KV blocks
#   (34 bytes per 32 values against 64); a q8_0 server answers a completion;
# - a plugin that cannot store the type (the step-only test fixture keeps
#   F16 only) stops the start: exit 4, the plugin and the type named, in
#   process and with --engine-process (the type crosses the engine wire);
# - a word not in the list is a usage error (exit 2).
# Usage: kv_cache_type_test.sh ENGINE_HOST TEST_PLUGIN_DIR CPU_REFERENCE_PLUGIN_DIR MODEL
source "$(dirname "$0")/testlib.sh"
eh=$1 test_plugins=$2 cpuref=$3 model=$4

# serve_health TYPE [MB [NAME]]: serves with --kv-cache-type TYPE in MB
# (default 4) MiB, saves /health in $scratch/NAME.json and a completion in
# $scratch/NAME.completion (NAME: TYPE).
serve_health() {
  local t=$1 mb=${2:-4} name=${3:-$1}
  local log=$scratch/serve-$name.log
  "$eh" --model "$model" --plugins "$cpuref" --device cpu --kv-cache-type "$t" --kv-cache-size-mb "$mb" --port 0 >"$log" 2>&1 &
  local pid=$!
  wait_for_line "$log" '"event":"ready"' $pid 30
  local port
  port=$(grep '"event":"listening"' "$log" | grep -o '"port":[0-9]*' | cut -d: -f2)
  curl --noproxy '*' -s "http://127.0.0.1:$port/health" >"$scratch/$name.json"
  curl --noproxy '*' -s "http://127.0.0.1:$port/metrics" >"$scratch/$name.metrics"
  curl --noproxy '*' -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":8,"temperature":0}' >"$scratch/$name.completion"
  kill -TERM $pid 2>/dev/null
  wait $pid
}

blocks() { grep -o '"kv_blocks_total":[0-9]*' "$scratch/$1.json" | cut -d: -f2; }

for t in f16 q8_0 fp8; do
  serve_health $t
  grep -q "\"kv_cache_type\":\"$t\"" "$scratch/$t.json"
  check "health-names-$t" $? "$(head -c 2000 "$scratch/$t.json")"
  grep '"event":"ready"' "$scratch/serve-$t.log" | grep -q "\"kv_cache_type\":\"$t\""
  check "ready-event-names-$t" $? "$(grep '"event":"ready"' "$scratch/serve-$t.log")"
  grep -q "^vllm:cache_config_info{.*cache_dtype=\"$t\"" "$scratch/$t.metrics"
  check "metrics-name-$t" $? "$(grep cache_config_info "$scratch/$t.metrics")"
done
f16=$(blocks f16) q8=$(blocks q8_0) fp8=$(blocks fp8)
[[ -n $f16 && -n $q8 && $((q8 * 100)) -ge $((f16 * 180)) && $fp8 -eq $q8 ]]
check q8_0-holds-twice-the-blocks $? "blocks in 4 MiB: f16 $f16, q8_0 $q8, fp8 $fp8"
# Without --ctx-size the context is what the pool holds, in the asked type:
# 1 MiB holds 144 f16 tokens of TinyTales (9 blocks) and 272 q8_0 (17).
serve_health f16 1 f16-1mb
serve_health q8_0 1 q8_0-1mb
ctx() { grep -o '"context_length":[0-9]*' "$scratch/$1.json" | cut -d: -f2; }
c16=$(ctx f16-1mb) c8=$(ctx q8_0-1mb)
[[ -n $c16 && -n $c8 && $((c8 * 100)) -ge $((c16 * 180)) ]]
check q8_0-context-from-the-same-mb $? "context in 1 MiB: f16 $c16, q8_0 $c8"

grep -q '"completion_tokens":8' "$scratch/q8_0.completion"
check q8_0-serves $? "$(head -c 2000 "$scratch/q8_0.completion")"

# bench and chat take it too
out=$("$eh" bench --model "$model" --plugins "$cpuref" --plugin cpu-reference -p 16 -n 4 -r 1 --kv-cache-type q8_0 --json 2>&1)
[[ $out == *'"kv_cache_type": "q8_0"'* && $out == *'"ok": true'* ]]
check bench-q8_0 $? "$(head -c 2000 <<<"$out")"
out=$("$eh" chat --model "$model" --plugins "$cpuref" --device cpu --kv-cache-type fp8 -p "Once upon a time" -n 6 --temp 0 2>&1)
rc=$?
[[ $rc -eq 0 && -n $out ]]
check chat-fp8 $? "exit $rc: $(head -c 2000 <<<"$out")"

# refuses NAME WANT-EXIT PATTERN -- command
refuses() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$(timeout 30 "$@" 2>&1); rc=$?
  [[ $rc -eq $want && $out == *"$pattern"* ]]
  check "$name" $? "exit $rc (want $want): $(tail -c 1500 <<<"$out")"
}
msg='error: plugin fixture-step-only cannot start with --kv-cache-type q8_0: kv_init: KV cache type Q8_0 is not supported: the test engine keeps F16 only [MODEL_LOAD_FAILED]'
refuses refused-by-a-plugin 4 "$msg" -- "$eh" --model "$model" --plugins "$test_plugins/step-only" --kv-cache-type q8_0 --port 0 --log-level off
refuses refused-through-the-engine-process 4 "$msg" -- "$eh" --model "$model" --plugins "$test_plugins/step-only" --kv-cache-type q8_0 --engine-process --port 0 --log-level off
refuses unknown-word 2 "error: --kv-cache-type must be one of f16, q8_0, fp8, not 'q4'" -- "$eh" --model "$model" --plugins "$cpuref" --kv-cache-type q4 --port 0 --log-level off

refuses bench-session-path 2 "error: bench: --kv-cache-type is the step path's (the session calls take no KV type)" -- "$eh" bench --model "$model" --plugins "$cpuref" --plugin cpu-reference -p 16 -n 4 -r 1 --kv-cache-type q8_0 --path session

finish
