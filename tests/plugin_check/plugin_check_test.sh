#!/usr/bin/env bash
# eh-plugin-check against plugins whose verdicts are known: the CPU reference
# (against itself as the reference) and the test engine's step-only build pass
# every check that applies; the same engine made to depend on its batch, or
# to break another ABI rule, fails that check by name; bad command lines
# exit 2.
# Usage: plugin_check_test.sh EH_PLUGIN_CHECK CPU_REFERENCE_SO TEST_PLUGIN_DIR MODEL
source "$(dirname "$0")/../cli/testlib.sh"
check_bin=$1 cpuref=$2 plugins=$3 model=$4
step_only=$plugins/step-only/libeh-fixture-step-only.so

out=$("$check_bin" "$cpuref" --model "$model" --reference "$cpuref" 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"25 passed, 0 failed, 0 skipped"* ]]; check cpu-reference-passes $? "exit $rc: $out"

# every check over a quantized KV cache, greedy agreement with the F32-cache reference included
for t in q8_0 fp8; do
  out=$("$check_bin" "$cpuref" --model "$model" --reference "$cpuref" --kv-type $t 2>&1); rc=$?
  [[ $rc -eq 0 && "$out" == *"25 passed, 0 failed, 0 skipped"* ]]; check cpu-reference-passes-$t $? "exit $rc: $out"
done

out=$("$check_bin" "$step_only" --model "$model" 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"20 passed, 0 failed, 5 skipped"* && "$out" == *"SKIP  step_halves"* &&
   "$out" == *"SKIP  lora_adapters"*"no adapter calls"* && "$out" == *"SKIP  embd_spans"*"no image calls"* ]]
check step-only-passes $? "exit $rc: $out"

# KV cache types: a type the plugin refuses stops the run (exit 3, named); one
# that takes any type and keeps F16 fails kv_cache_type; one from before the
# types is skipped there
out=$("$check_bin" "$step_only" --model "$model" --kv-type q8_0 2>&1); rc=$?
[[ $rc -eq 3 && "$out" == *"kv_init returned UNSUPPORTED: kv_init: KV cache type Q8_0 is not supported"* ]]
check kv-type-refused $? "exit $rc: $out"
out=$(EH_TEST_ENGINE_KV_ANY_TYPE=1 "$check_bin" "$step_only" --model "$model" --kv-type q8_0 --only kv_cache_type 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL  kv_cache_type"*"kv_init asked for KV type 8 granted type 1"* ]]
check kv-type-not-kept $? "exit $rc: $out"
out=$(EH_TEST_ENGINE_KV_ANY_TYPE=1 "$check_bin" "$step_only" --model "$model" --only kv_cache_type 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL  kv_cache_type"*"granted the undefined KV type 77"* ]]
check kv-type-undefined-granted $? "exit $rc: $out"
out=$(EH_TEST_ENGINE_KV_INFO_1_3=1 "$check_bin" "$step_only" --model "$model" --only kv_cache_type 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"SKIP  kv_cache_type"*"predates ABI 1.4"* ]]
check kv-type-predates $? "exit $rc: $out"
out=$("$check_bin" "$step_only" --model "$model" --kv-type q4 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"--kv-type must be f16, q8_0 or fp8, not 'q4'"* ]]; check kv-type-unknown-word $? "exit $rc: $out"

out=$(EH_TEST_ENGINE_BATCH_DEPENDENT=1 "$check_bin" "$step_only" --model "$model" 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL  batch_invariance"*"token 0 differs"* ]]; check batch-dependence-found $? "exit $rc: $out"
# batch_compositions runs only when named, and finds it too
[[ $out != *"batch_compositions"* ]]; check compositions-asked-only $? "$out"
out=$(EH_TEST_ENGINE_BATCH_DEPENDENT=1 "$check_bin" "$step_only" --model "$model" --only batch_compositions 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL  batch_compositions"*"differs"* ]]; check batch-compositions-found $? "exit $rc: $out"
out=$("$check_bin" "$step_only" --model "$model" --only batch_compositions 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"PASS  batch_compositions"* ]]; check batch-compositions-pass $? "exit $rc: $out"

# The same engine breaking one ABI rule at a time fails the check that
# holds it, by name
expect_fail() {  # KNOB CHECK DETAIL
  local out rc
  out=$(env "EH_TEST_ENGINE_$1=1" "$check_bin" "$step_only" --model "$model" 2>&1); rc=$?
  [[ $rc -eq 1 && "$out" == *"FAIL  $2"*"$3"* && "$out" == *"19 passed, 1 failed, 5 skipped"* ]]
  check "$2-found" $? "exit $rc: $out"
}
expect_fail LAX_TOKENS invalid_steps "a token id equal to the vocabulary size returned OK, not INVALID_ARGUMENT"
expect_fail KEEP_BLOCKS truncate_regrow "truncated to 15 tokens, the sequence holds 2 blocks, not 1"
expect_fail NO_COPY fork_shares_prefix "a fork of 13 tokens grown to 28 took 1 free blocks, not 2"
expect_fail BIASED_LOGITS logit_bias "not the raw logits"
expect_fail PROGRESS_BACK load_progress_cancel "progress went back from 0.5 to 0.25"
expect_fail VERIFY_KEEPS_REJECTED speculative_verify "the sequence grew by 5, not 2 (the rejected drafts must leave it)"
# a restored sequence that continues differently from the one parked (ABI 1.7)
expect_fail PARK_DRIFT park_restore "logit "
# a 1.6 plugin that grants no draft tokens must refuse EH_STEP_VERIFY as an unknown flag
out=$(EH_TEST_ENGINE_NO_VERIFY=1 "$check_bin" "$step_only" --model "$model" --only speculative_verify 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"PASS  speculative_verify"* ]]; check no-verify-refuses-the-flag $? "exit $rc: $out"

out=$("$check_bin" "$step_only" --model "$model" --only fork_shares_prefix --json 2>&1); rc=$?
[[ $rc -eq 0 && $(grep -c '"name"' <<<"$out") -eq 1 && "$out" == *'"status": "pass"'* ]]; check only-json $? "exit $rc: $out"

out=$("$check_bin" "$plugins/good/libeh-test-engine.so" --model "$model" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"has no batched step"* ]]; check session-only-refused $? "exit $rc: $out"

out=$("$check_bin" "$cpuref" --model "$model" --reference "$plugins/good/libeh-test-engine.so" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"the reference plugin has no batched step"* ]]; check session-only-reference-refused $? "exit $rc: $out"

out=$("$check_bin" "$step_only" --model "$model" --only no_such_check 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"no check is named 'no_such_check'"* ]]; check unknown-check $? "exit $rc: $out"

# --engine-options reach the plugin's load (the test engine refuses one that asks it to)
out=$("$check_bin" "$step_only" --model "$model" --engine-options '{"refuse_load":true}' 2>&1); rc=$?
[[ $rc -eq 3 && "$out" == *"model_load failed"*"fixture: the load options ask for a refusal"* ]]
check engine-options-reach-the-load $? "exit $rc: $out"

out=$("$check_bin" "$step_only" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"--model are required"* ]]; check no-model $? "exit $rc: $out"

out=$("$check_bin" "$plugins/crash/libeh-fixture-crash.so" --model "$model" 2>&1); rc=$?
[[ $rc -eq 3 && "$out" == *"the host rejects the plugin"*"crashed with signal 11"* ]]; check rejected-plugin $? "exit $rc: $out"

finish
