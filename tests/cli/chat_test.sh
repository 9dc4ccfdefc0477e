#!/usr/bin/env bash
# `engine-host chat`: one-shot (-p), the interactive loop through a pipe
# (/reset, /exit, end of input), and Ctrl-C stopping a reply but not the
# program. Usage: chat_test.sh ENGINE_HOST TEST_PLUGIN_DIR TESTDATA_DIR
set -uo pipefail
eh=$1 plugins=$2 testdata=$3
model=$testdata/models/stories260K.gguf
fails=0 passes=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
check() {  # NAME CONDITION-RESULT DETAIL
  if [[ $2 -eq 0 ]]; then passes=$((passes + 1)); else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

# One-shot through the CPU reference plugin, found beside the executable (no --plugins).
out=$("$eh" chat -m "$model" -p "Once upon a time" -n 24 --seed 7 --temp 0 2>"$scratch/err")
rc=$?
check oneshot-exit $rc "exit $rc: $(cat "$scratch/err")"
words=$(wc -w <<<"$out")
[[ $words -ge 5 && "$out" =~ [a-z]+\ [a-z]+ ]]; check oneshot-text $? "expected a few words of a story, got '$out'"
again=$("$eh" chat -m "$model" -p "Once upon a time" -n 24 --seed 7 --temp 0 2>/dev/null)
[[ "$again" == "$out" ]]; check oneshot-greedy-repeats $? "'$again' != '$out'"

# Interactive through a pipe: two turns, a reset, /exit stops reading.
out=$(printf 'Hello there\n/reset\n\nThe cat\n/exit\nnever read\n' | "$eh" chat -m "$model" -n 12 --seed 1 2>"$scratch/err")
rc=$?
check pipe-exit $rc "exit $rc: $(cat "$scratch/err")"
[[ $(grep -c . <<<"$out") -ge 3 ]]; check pipe-two-replies $? "got: $out"
grep -aq '^(conversation reset)$' <<<"$out"; check pipe-reset $? "no reset line in: $out"
out=$(printf 'Hi\n' | "$eh" chat -m "$model" -n 8 2>&1)
check pipe-eof-exits $? "end of input should end the chat: $out"

# Ctrl-C: the test engine sleeps 40 ms per token, so 400 tokens take 16 s;
# SIGINT after ~1 s stops the reply, the next line is still read.
mkfifo "$scratch/in"
EH_TEST_ENGINE_DELAY_MS=40 "$eh" chat -m "$model" --plugins "$plugins/good" -n 400 <"$scratch/in" >"$scratch/out" 2>&1 &
pid=$!
exec 3>"$scratch/in"
echo "tell me a long story" >&3
sleep 1
kill -INT $pid
sleep 0.5
kill -0 $pid 2>/dev/null; check ctrl-c-keeps-running $? "the chat exited on Ctrl-C"
kill -INT $pid  # at the prompt: a hint, not an exit
sleep 0.3
echo "/exit" >&3
exec 3>&-
start=$(date +%s)
wait $pid
rc=$?
check ctrl-c-exit-code $rc "exit $rc: $(tr -d "\\0" <"$scratch/out")"
[[ $(( $(date +%s) - start )) -lt 10 ]]; check ctrl-c-stops-quickly $? "took too long"
grep -aq '\[stopped\]' "$scratch/out"; check ctrl-c-marks-reply $? "$(tr -d "\\0" <"$scratch/out")"
grep -aq 'Ctrl-C stops a reply; /exit or Ctrl-D leaves' "$scratch/out"; check ctrl-c-at-prompt $? "$(tr -d "\\0" <"$scratch/out")"

out=$("$eh" chat -m "$model" -n 0 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"--n-predict must be between 1 and 2048"* ]]; check bad-n-predict $? "exit $rc: $out"
out=$("$eh" chat 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"'--model' is required"* ]]; check no-model $? "exit $rc: $out"

echo "$passes passed, $fails failed"
[[ $fails -eq 0 ]]
