#!/usr/bin/env bash
# `engine-host bench` stops on SIGTERM and SIGINT while the CPU reference
# plugin runs (issue 26: it ran on for minutes): a message on stderr, no
# results, exit 143 / 130, within a generous bound (not a timing test). The
# bench is started as a background job of this script, which inherits SIGINT
# ignored: bench installs its own handlers, so SIGINT stops it as well.
# Usage: bench_signal_test.sh ENGINE_HOST CPU_REFERENCE_PLUGIN_DIR TESTDATA_DIR
set -uo pipefail
eh=$1 plugins=$2 testdata=$3
model=$testdata/models/stories260K.gguf
fails=0 passes=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# stops NAME SIGNAL EXIT: bench (far more work than the test's time) gets
# SIGNAL once it is benchmarking, and must exit with EXIT within 10 s,
# saying so.
stops() {
  local name=$1 sig=$2 want=$3 log=$scratch/$1.log
  "$eh" bench --model "$model" --plugins "$plugins" --plugin cpu-reference -p 64 -n 64 -r 1000000 -v >"$scratch/$name.out" 2>"$log" &
  local pid=$!
  for _ in $(seq 200); do
    grep -q 'rep 0' "$log" && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  sleep 0.5
  kill -"$sig" $pid 2>/dev/null
  local waited=0
  while kill -0 $pid 2>/dev/null && ((waited < 100)); do sleep 0.1; waited=$((waited + 1)); done
  if kill -0 $pid 2>/dev/null; then
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    echo "FAIL $name: still running 10 s after SIG$sig: $(tail -c 1000 "$log")"
    fails=$((fails + 1))
    return
  fi
  wait $pid
  local rc=$?
  if [[ $rc -eq $want ]] && grep -q "^error: bench stopped by SIG$sig; no results" "$log" && [[ ! -s $scratch/$name.out ]]; then
    passes=$((passes + 1))
  else
    echo "FAIL $name: exit $rc (want $want), stdout $(wc -c <"$scratch/$name.out") bytes, stderr: $(tail -c 1000 "$log")"
    fails=$((fails + 1))
  fi
}

stops bench-sigterm TERM 143
stops bench-sigint INT 130

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
