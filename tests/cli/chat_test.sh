#!/usr/bin/env bash
# `engine-host chat`: one-shot (-p), the interactive loop through a pipe
# (/reset, /exit, end of input), and Ctrl-C stopping a reply but not the
# program. Usage: chat_test.sh ENGINE_HOST TEST_PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 testdata=$3
model=$testdata/models/stories260K.gguf

# One-shot through the CPU reference plugin, found beside the executable (no
# --plugins). --device cpu: a CUDA build's GPU plugins are there too, and
# rejected on a machine without a GPU (device_test.sh has the default's refusal).
out=$("$eh" chat -m "$model" --device cpu -p "Once upon a time" -n 24 --seed 7 --temp 0 2>"$scratch/err")
rc=$?
check oneshot-exit $rc "exit $rc: $(cat "$scratch/err")"
words=$(wc -w <<<"$out")
[[ $words -ge 5 && "$out" =~ [a-z]+\ [a-z]+ ]]; check oneshot-text $? "expected a few words of a story, got '$out'"
again=$("$eh" chat -m "$model" --device cpu -p "Once upon a time" -n 24 --seed 7 --temp 0 2>/dev/null)
[[ "$again" == "$out" ]]; check oneshot-greedy-repeats $? "'$again' != '$out'"

# Interactive through a pipe: two turns, a reset, /exit stops reading.
out=$(printf 'Hello there\n/reset\n\nThe cat\n/exit\nnever read\n' | "$eh" chat -m "$model" --device cpu -n 12 --seed 1 2>"$scratch/err")
rc=$?
check pipe-exit $rc "exit $rc: $(cat "$scratch/err")"
[[ $(grep -c . <<<"$out") -ge 3 ]]; check pipe-two-replies $? "got: $out"
grep -aq '^(conversation reset)$' <<<"$out"; check pipe-reset $? "no reset line in: $out"
out=$(printf 'Hi\n' | "$eh" chat -m "$model" --device cpu -n 8 2>&1)
check pipe-eof-exits $? "end of input should end the chat: $out"

# A turn that no longer fits the context fails alone; /reset starts over.
long=$(printf 'once upon a time %.0s' {1..40})
out=$(printf '%s\n/reset\nhi\n' "$long" | "$eh" chat -m "$model" --device cpu -c 64 -n 8 --seed 1 2>"$scratch/err")
rc=$?
[[ $rc -eq 0 && "$(cat "$scratch/err")" == *"the conversation fills the context (64 tokens; this turn's prompt is "*"); start a new one with /reset"* ]]
check context-full-turn $? "exit $rc: $(cat "$scratch/err")"
[[ $(grep -v '^(conversation reset)$' <<<"$out" | grep -c .) -eq 1 ]]; check context-full-then-reply $? "got: $out"

# The built-in model (context 512) with the default --n-predict (512): the
# reply gets what the context has left after the prompt, never a refusal.
tinytales=$(cd "$(dirname "$0")/../.." && pwd)/models/tinytales.gguf
out=$("$eh" chat -m "$tinytales" --device cpu -p "Tell me a story about a shy owl named Milo." --temp 0 2>"$scratch/err")
rc=$?
[[ $rc -eq 0 && $(wc -w <<<"$out") -ge 5 ]]; check default-model-first-turn $? "exit $rc: $(cat "$scratch/err") $out"
out=$(printf 'Tell me a story.\nTell me another one.\n' | "$eh" chat -m "$tinytales" --device cpu --seed 3 2>"$scratch/err")
rc=$?
[[ $rc -eq 0 && ! -s "$scratch/err" && $(grep -c . <<<"$out") -ge 2 ]]
check default-model-two-turns $? "exit $rc: $(cat "$scratch/err") $out"

# A reply that reaches the end of the context (the test engine never ends
# one) stops there and says so; the next turn is refused with the same words.
out=$(printf 'hi\nand then\n/reset\nhi\n' |
      "$eh" chat -m "$model" --plugins "$plugins/good" -c 64 -n 2048 2>"$scratch/err" | tr -d '\000')
rc=$?
check fills-context-exit $rc "exit $rc: $(cat "$scratch/err")"
[[ $(grep -c '^(the conversation fills the context (64 tokens); start a new one with /reset)$' <<<"$out") -eq 2 ]]
check fills-context-note $? "got: $out"
[[ "$(cat "$scratch/err")" == *"the conversation fills the context (64 tokens; this turn's prompt is "*"); start a new one with /reset"* ]]
check fills-context-next-turn $? "$(cat "$scratch/err")"

# Ctrl-C: the test engine sleeps 40 ms per token, so 400 tokens take 16 s.
# Each step waits for the output of the one before (a loaded machine is slow).
wait_for() {  # PATTERN: up to 20 s for it to appear in the output
  for _ in $(seq 200); do grep -aq -- "$1" "$scratch/out" && return 0; sleep 0.1; done
  return 1
}
mkfifo "$scratch/in"
EH_TEST_ENGINE_DELAY_MS=40 "$eh" chat -m "$model" --plugins "$plugins/good" -n 400 <"$scratch/in" >"$scratch/out" 2>&1 &
pid=$!
exec 3>"$scratch/in"
echo "tell me a long story" >&3
for _ in $(seq 200); do [[ -s "$scratch/out" ]] && break; sleep 0.1; done  # the reply has begun
start=$(date +%s)
kill -INT $pid
wait_for '\[stopped\]'; check ctrl-c-marks-reply $? "$(tr -d "\\0" <"$scratch/out")"
[[ $(( $(date +%s) - start )) -lt 8 ]]; check ctrl-c-stops-quickly $? "the reply went on"
kill -0 $pid 2>/dev/null; check ctrl-c-keeps-running $? "the chat exited on Ctrl-C"
kill -INT $pid  # at the prompt: a hint, not an exit
wait_for 'Ctrl-C stops a reply; /exit or Ctrl-D leaves'; check ctrl-c-at-prompt $? "$(tr -d "\\0" <"$scratch/out")"
echo "/exit" >&3
exec 3>&-
wait $pid
rc=$?
check ctrl-c-exit-code $rc "exit $rc: $(tr -d "\\0" <"$scratch/out")"

# A reply holding a NUL (the test engine scripted to emit the <0x00> byte
# token, id 3) does not end the conversation: the next turn is answered, not
# refused with "'messages' contains a NUL character".
out=$(printf 'Hi\nAnd then?\n' | EH_TEST_ENGINE_SCRIPT=300,3,301 "$eh" chat -m "$model" --plugins "$plugins/good" -n 8 2>"$scratch/err" | tr -d '\000')
rc=$?
[[ $rc -eq 0 && $(grep -c . <<<"$out") -eq 2 && "$(cat "$scratch/err")" != *NUL* ]]
check nul-reply-next-turn $? "exit $rc: $out / $(cat "$scratch/err")"

out=$("$eh" chat -m "$model" -n 0 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"--n-predict must be between 1 and 2048"* ]]; check bad-n-predict $? "exit $rc: $out"
for flags in "--temp 3" "--top-p 0" "--top-k -1"; do
  out=$("$eh" chat -m "$model" $flags 2>&1); rc=$?
  [[ $rc -eq 2 && "$out" == *"${flags%% *} must"* ]]; check "bad ${flags%% *}" $? "exit $rc: $out"
done
out=$("$eh" chat 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"'--model' is required"* ]]; check no-model $? "exit $rc: $out"

finish
