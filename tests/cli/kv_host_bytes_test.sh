#!/usr/bin/env bash
# serve --kv-host-bytes (issue 50, the prefix cache's host tier): the most it
# takes (1 TiB) and its conflict with --no-prefix-cache are usage errors
# (exit 2) that name the number; within the limit the server starts, says so
# in its log and /health. (The tier's behaviour: tests/service/host_tier_test.cpp,
# tests/http/cpu_reference_e2e_test.cpp.)
# Usage: kv_host_bytes_test.sh ENGINE_HOST CPU_REFERENCE_PLUGIN_DIR MODEL
source "$(dirname "$0")/testlib.sh"
eh=$1 cpuref=$2 model=$3

refuses() {  # NAME WANT_EXIT PATTERN -- CMD...
  local name=$1 want=$2 pattern=$3
  shift 4
  out=$(timeout 30 "$@" 2>&1); rc=$?
  [[ $rc -eq $want && $out == *"$pattern"* ]]
  check "$name" $? "exit $rc (want $want): $(tail -c 1500 <<<"$out")"
}
refuses over-1-tib 2 "error: --kv-host-bytes 1099511627777 is more than the most, 1099511627776 (1 TiB)" -- \
  "$eh" --model "$model" --plugins "$cpuref" --kv-host-bytes 1099511627777 --port 0 --log-level off
refuses without-a-prefix-cache 2 "error: --kv-host-bytes parks the prefix cache's entries: it cannot go with --no-prefix-cache" -- \
  "$eh" --model "$model" --plugins "$cpuref" --kv-host-bytes 1000000 --no-prefix-cache --port 0 --log-level off
refuses not-a-number 2 "kv-host-bytes" -- "$eh" --model "$model" --plugins "$cpuref" --kv-host-bytes lots --port 0 --log-level off

# 1 TiB itself is taken (nothing is allocated until prefixes are parked)
log=$scratch/serve.log
"$eh" --model "$model" --plugins "$cpuref" --device cpu --kv-host-bytes 1099511627776 --port 0 >"$log" 2>&1 &
pid=$!
wait_for_line "$log" '"event":"ready"' $pid 30
port=$(grep '"event":"listening"' "$log" | grep -o '"port":[0-9]*' | cut -d: -f2)
health=$(curl --noproxy '*' -s "http://127.0.0.1:$port/health")
kill -TERM $pid 2>/dev/null
wait $pid
[[ $health == *'"kv_host_tier":{"budget_bytes":1099511627776'* ]]; check health-budget $? "$health"
grep -q '"event":"host_tier".*"kv_host_bytes":1099511627776' "$log"; check start-line $? "$(head -c 3000 "$log")"
finish
