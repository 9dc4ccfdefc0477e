#!/usr/bin/env bash
# `engine-host bench` stops on SIGTERM and SIGINT while the CPU reference
# plugin runs (issue 26: it ran on for minutes): a message on stderr, no
# results, exit 143 / 130, within a generous bound (not a timing test). The
# bench is started as a background job of this script, which inherits SIGINT
# ignored: bench installs its own handlers, so SIGINT stops it as well.
# Usage: bench_signal_test.sh ENGINE_HOST CPU_REFERENCE_PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 testdata=$3
model=$testdata/models/stories260K.gguf

# stops NAME SIGNAL EXIT: bench (far more work than the test's time) gets
# SIGNAL once it is benchmarking, and must exit with EXIT within 10 s,
# saying so.
stops() {
  local name=$1 sig=$2 want=$3 log=$scratch/$1.log out=$scratch/$1.out
  "$eh" bench --model "$model" --plugins "$plugins" --plugin cpu-reference -p 64 -n 64 -r 1000000 -v >"$out" 2>"$log" &
  local pid=$!
  wait_for_line "$log" 'rep 0' $pid 20
  sleep 0.5
  kill -"$sig" $pid 2>/dev/null
  if ! exits_within $pid 10; then
    check "$name" 1 "still running 10 s after SIG$sig: $(tail -c 1000 "$log")"
    return
  fi
  wait $pid
  local rc=$?
  [[ $rc -eq $want ]] && grep -q "^error: bench stopped by SIG$sig; no results" "$log" && [[ ! -s $out ]]
  check "$name" $? "exit $rc (want $want), stdout $(wc -c <"$out") bytes, stderr: $(tail -c 1000 "$log")"
}

stops bench-sigterm TERM 143
stops bench-sigint INT 130

finish
