#!/usr/bin/env bash
# eh-plugin-check against plugins whose verdicts are known: the CPU reference
# (against itself as the reference) and the test engine's step-only build pass
# every check that applies; the same engine made to depend on its batch
# fails batch_invariance by name; bad command lines exit 2.
# Usage: plugin_check_test.sh EH_PLUGIN_CHECK CPU_REFERENCE_SO TEST_PLUGIN_DIR MODEL
source "$(dirname "$0")/../cli/testlib.sh"
check_bin=$1 cpuref=$2 plugins=$3 model=$4
step_only=$plugins/step-only/libeh-fixture-step-only.so

out=$("$check_bin" "$cpuref" --model "$model" --reference "$cpuref" 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"16 passed, 0 failed, 0 skipped"* ]]; check cpu-reference-passes $? "exit $rc: $out"

out=$("$check_bin" "$step_only" --model "$model" 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"14 passed, 0 failed, 2 skipped"* && "$out" == *"SKIP  step_halves"* ]]
check step-only-passes $? "exit $rc: $out"

out=$(EH_TEST_ENGINE_BATCH_DEPENDENT=1 "$check_bin" "$step_only" --model "$model" 2>&1); rc=$?
[[ $rc -eq 1 && "$out" == *"FAIL  batch_invariance"*"token 0 differs"* ]]; check batch-dependence-found $? "exit $rc: $out"

out=$("$check_bin" "$step_only" --model "$model" --only fork_shares_prefix --json 2>&1); rc=$?
[[ $rc -eq 0 && $(grep -c '"name"' <<<"$out") -eq 1 && "$out" == *'"status": "pass"'* ]]; check only-json $? "exit $rc: $out"

out=$("$check_bin" "$plugins/good/libeh-test-engine.so" --model "$model" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"has no batched step"* ]]; check session-only-refused $? "exit $rc: $out"

out=$("$check_bin" "$cpuref" --model "$model" --reference "$plugins/good/libeh-test-engine.so" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"the reference plugin has no batched step"* ]]; check session-only-reference-refused $? "exit $rc: $out"

out=$("$check_bin" "$step_only" --model "$model" --only no_such_check 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"no check is named 'no_such_check'"* ]]; check unknown-check $? "exit $rc: $out"

out=$("$check_bin" "$step_only" 2>&1); rc=$?
[[ $rc -eq 2 && "$out" == *"--model are required"* ]]; check no-model $? "exit $rc: $out"

out=$("$check_bin" "$plugins/crash/libeh-fixture-crash.so" --model "$model" 2>&1); rc=$?
[[ $rc -eq 3 && "$out" == *"the host rejects the plugin"*"crashed with signal 11"* ]]; check rejected-plugin $? "exit $rc: $out"

finish
