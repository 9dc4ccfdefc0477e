#!/usr/bin/env bash
# eh-plugin-check against the CUDA plugins on the GPU machine: llama-cuda on
# the trained stories260K with the CPU reference as its reference, and both
# CUDA plugins on forged toy-size files of their architectures.
# Usage: gpu_test.sh EH_PLUGIN_CHECK ENGINE_HOST PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/../cli/testlib.sh"
check_bin=$1 eh=$2 dir=$3 testdata=$4
export EH_TESTDATA_DIR=$testdata

out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" \
      --reference "$dir/libeh-cpu-reference.so" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 ]]; check llama-cuda-stories $? "exit $rc"

# The CUDA plugins keep F16 KV blocks only: a quantized cache is refused by name
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" --kv-type q8_0 2>&1); rc=$?
[[ $rc -eq 3 && $out == *"KV cache type Q8_0 is not supported: not implemented on CUDA yet"* ]]
check llama-cuda-refuses-q8_0-kv $? "exit $rc: $out"

for spec in llama-cuda:tiny-llama-3.1-q4_k_m gpt-cuda:tiny-qwen3-moe-q4_k_m gpt-cuda:tiny-gpt-oss-mxfp4; do
  plugin=${spec%%:*} profile=${spec#*:}
  if ! "$eh" forge --like "$profile" --out "$scratch/$profile.gguf" >"$scratch/forge.log" 2>&1; then
    check "forge-$profile" 1 "$(cat "$scratch/forge.log")"
    continue
  fi
  out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" 2>&1); rc=$?
  echo "$out"
  [[ $rc -eq 0 ]]; check "$plugin-$profile" $? "exit $rc"
  if [[ $plugin == gpt-cuda ]]; then
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" --kv-type fp8 2>&1); rc=$?
    [[ $rc -eq 3 && $out == *"KV cache type FP8_E4M3 is not supported: not implemented on CUDA yet"* ]]
    check gpt-cuda-refuses-fp8-kv $? "exit $rc: $out"
  fi
done
finish
