#!/usr/bin/env bash
# The command line on the CPU reference plugin (a real engine's checks and
# speed), issue 26:
# - `bench` stops on SIGTERM and SIGINT (it ran on for minutes): a message on
#   stderr, no results, exit 143 / 130, within a generous bound (not a timing
#   test). The bench is a background job of this script, which inherits
#   SIGINT ignored: bench installs its own handlers, so SIGINT stops it too.
# - `inspect --load` says when the plugin's own load refuses a file (a tensor
#   missing), with serve's exit code; without --load it does not look.
# Usage: cpu_reference_test.sh ENGINE_HOST CPU_REFERENCE_PLUGIN_DIR TESTDATA_DIR
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

# A same-length rename keeps the GGUF valid: only the plugin's load finds the
# tensor missing.
LC_ALL=C perl -pe 's/blk\.0\.attn_q\.weight/blk.0.attn_x.weight/g' "$model" >"$scratch/no-q.gguf"
out=$("$eh" inspect --model "$scratch/no-q.gguf" --plugins "$plugins" --device cpu --load 2>&1); rc=$?
[[ $rc -eq 4 && $out == *"verdict"*"no: serve refuses this file"* && $out == *"missing tensor 'blk.0.attn_q.weight' [MODEL_LOAD_FAILED]"* ]]
check inspect-load-refused $? "exit $rc: $(tail -c 1500 <<<"$out")"
out=$(timeout 20 "$eh" --model "$scratch/no-q.gguf" --plugins "$plugins" --device cpu --port 0 --log-level off 2>&1); rc=$?
[[ $rc -eq 4 && $out == *"missing tensor 'blk.0.attn_q.weight'"* ]]
check serve-refuses-the-same $? "exit $rc: $(tail -c 1500 <<<"$out")"
out=$("$eh" inspect --model "$scratch/no-q.gguf" --plugins "$plugins" --device cpu 2>&1); rc=$?
[[ $rc -eq 0 && $out == *"yes, as far as checked"*"--load"* ]]
check inspect-without-load-does-not-look $? "exit $rc: $(tail -c 1500 <<<"$out")"
out=$("$eh" inspect --model "$model" --plugins "$plugins" --device cpu --load --json 2>&1); rc=$?
[[ $rc -eq 0 && $out == *'"serves":true'* && $out == *'"exit_code":0'* && $out == *"plugin load"* ]]
check inspect-load-serves $? "exit $rc: $(tail -c 1500 <<<"$out")"

finish
