#!/usr/bin/env bash
# The CPU reference's ABI contract is eh-plugin-check's: on the trained
# stories260K (llama) and on forged toy files of four other architectures
# it serves, every check passes by name (reference_agreement, with no
# --reference, is skipped; batch_compositions, which runs only when named,
# in a run of its own). Its own gtests keep what only it promises
# (bit-identical logits, the session path, its refusals); the loader holds
# its self-description to its manifest on every load.
# Usage: cpu_reference_test.sh EH_PLUGIN_CHECK ENGINE_HOST CPU_REFERENCE_SO MODEL
source "$(dirname "$0")/../cli/testlib.sh"
check_bin=$1 eh=$2 cpuref=$3 stories=$4

# verdict JSON NAME: the status the --json output gives the named check
verdict() {
  grep -A1 "\"name\": \"$2\"" <<<"$1" | sed -n 's/.*"status": "\([a-z]*\)".*/\1/p'
}

expect_all_pass() {  # LABEL MODEL
  local out rc name n=0
  out=$("$check_bin" "$cpuref" --model "$2" --json 2>&1); rc=$?
  [[ $rc -eq 0 ]]; check "$1-exit" $? "exit $rc: $out"
  # the loader accepted it: its self-description agrees with its manifest
  [[ $out == *'"plugin": "cpu-reference"'* ]]; check "$1-accepted" $? "$out"
  while read -r name _; do
    n=$((n + 1))
    [[ $name == batch_compositions ]] && continue  # (runs only when named: below)
    local want=pass
    [[ $name == reference_agreement ]] && want=skip
    [[ $(verdict "$out" "$name") == "$want" ]]; check "$1-$name" $? "want $want: $(grep -A3 "\"name\": \"$name\"" <<<"$out")"
  done < <("$check_bin" --list)
  [[ $n -ge 20 ]]; check "$1-listed" $? "eh-plugin-check --list named $n checks"
  out=$("$check_bin" "$cpuref" --model "$2" --only batch_compositions --json 2>&1)
  [[ $(verdict "$out" batch_compositions) == pass ]]; check "$1-batch_compositions" $? "$out"
}

expect_all_pass stories260K "$stories"
for profile in tiny-phi-3-q4_k_m tiny-gpt-oss-mxfp4 tiny-qwen3-moe-q4_k_m tiny-gemma-3-q4_k_m; do
  if ! "$eh" forge --like "$profile" --out "$scratch/$profile.gguf" >"$scratch/forge.log" 2>&1; then
    check "forge-$profile" 1 "$(cat "$scratch/forge.log")"
    continue
  fi
  expect_all_pass "$profile" "$scratch/$profile.gguf"
  rm -f "$scratch/$profile.gguf"
done
finish
