#!/usr/bin/env bash
# eh-plugin-check against the CUDA plugins on the GPU machine: llama-cuda on
# the trained stories260K with the CPU reference as its reference, and both
# CUDA plugins on forged toy-size files of their architectures (llama-cuda's
# Llama 3.1 and Gemma 3, gpt-cuda's Qwen3-MoE with and without its
# batch_invariant load option, and gpt-oss); on each, ABI 1.7's park_restore
# must pass (a restored sequence's logits bit for bit), not be skipped, and
# ABI 1.5's hidden_state too (llama-cuda keeps hidden states, gpt-cuda
# refuses the flag); on the forged files both again with Q8_0 and FP8_E4M3
# KV pools (--kv-type).
# Usage: gpu_test.sh EH_PLUGIN_CHECK ENGINE_HOST PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/../cli/testlib.sh"
check_bin=$1 eh=$2 dir=$3 testdata=$4
export EH_TESTDATA_DIR=$testdata

out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" \
      --reference "$dir/libeh-cpu-reference.so" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 ]]; check llama-cuda-stories $? "exit $rc"
# ABI 1.7's host tier: a parked and restored sequence continues bit for bit
[[ $out == *"PASS  park_restore"* ]]; check llama-cuda-stories-park-restore $? "$out"
# ABI 1.5's final hidden state (embeddings, rerank): the same alone and in a
# mixed, chunked batch
[[ $out == *"PASS  hidden_state"* ]]; check llama-cuda-stories-hidden-state $? "$out"

# Tensor parallelism in the one-GPU shard mode (ABI 1.6 device set 0,0): every
# check, and greedy agreement with the CPU reference, on llama-cuda split
# over two ranks (stories260K: 4 KV heads, a 172-wide F32 FFN cut 86 / 86).
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" --gpus 0,0 \
      --reference "$dir/libeh-cpu-reference.so" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 ]]; check llama-cuda-stories-shard-mode $? "exit $rc"
# The same with each rank on its own stream ("tensor_parallel": "streams":
# the distinct-GPU code path, both ranks on GPU 0)
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" --gpus 0,0 \
      --engine-options '{"tensor_parallel":"streams"}' --reference "$dir/libeh-cpu-reference.so" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 ]]; check llama-cuda-stories-rank-streams $? "exit $rc"

# The checks a quantized KV pool runs (one --only NAME pair a line), every
# one but speculative_verify, chunked_prefill and batch_compositions (embd_spans takes the
# by-name refusal of an image's bidirectional span with a quantized cache),
# whose greedy tokens must match across step shapes: a multi-token step's
# matmuls differ from a one-token step's in the last bits, which an F16
# cache keeps but a quantized one may turn into a code one step off (H200:
# a near-tied token flipped once each on the tiny Llama and Qwen3-MoE files
# with Q8_0). Qwen3-MoE leaves batch_invariance out too, as above.
kv_checks() {
  local name
  for name in $("$check_bin" --list | awk '{print $1}'); do
    case $name in speculative_verify|chunked_prefill|batch_compositions) continue ;; esac
    [[ $1 == tiny-qwen3-moe-q4_k_m && $name == batch_invariance ]] && continue
    printf '%s\n%s\n' --only "$name"
  done
}

# A quantized pool's 32-value blocks may span heads: stories260K (4 KV heads
# of 8, one block a row) passes those checks with Q8_0; split over two ranks
# a row is 16 values, not a whole block, and kv_init refuses it by name
mapfile -t kv_only < <(kv_checks stories260K)
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" --kv-type q8_0 \
      "${kv_only[@]}" 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 && $out == *"PASS  kv_cache_type"* && $out == *"PASS  park_restore"* ]]
check llama-cuda-stories-kv-q8_0 $? "exit $rc"
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$testdata/models/stories260K.gguf" --gpus 0,0 --kv-type q8_0 2>&1); rc=$?
[[ $rc -eq 3 && $out == *"KV cache type Q8_0 is not supported: a K/V row of 16 values is not a whole number of 32-value blocks"* ]]
check llama-cuda-shard-mode-refuses-q8_0-kv-row-16 $? "exit $rc: $out"

for spec in llama-cuda:tiny-llama-3.1-q4_k_m llama-cuda:tiny-gemma-3-q4_k_m gpt-cuda:tiny-qwen3-moe-q4_k_m \
            gpt-cuda:tiny-gpt-oss-mxfp4; do
  plugin=${spec%%:*} profile=${spec#*:}
  if ! "$eh" forge --like "$profile" --out "$scratch/$profile.gguf" >"$scratch/forge.log" 2>&1; then
    check "forge-$profile" 1 "$(cat "$scratch/forge.log")"
    continue
  fi
  only=()
  if [[ $profile == tiny-qwen3-moe-q4_k_m ]]; then
    # gpt-cuda promises batch invariance with its batch_invariant option
    # only (plugins/cuda-common/README.md, Determinism): every check with it,
    # every check but that one without it.
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" \
          --engine-options '{"batch_invariant":true}' 2>&1); rc=$?
    echo "$out"
    [[ $rc -eq 0 ]]; check "$plugin-$profile-batch-invariant" $? "exit $rc"
    for name in $("$check_bin" --list | awk '{print $1}'); do
      [[ $name == batch_invariance || $name == batch_compositions ]] || only+=(--only "$name")
    done
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" "${only[@]}" 2>&1); rc=$?
  else
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" 2>&1); rc=$?
  fi
  echo "$out"
  [[ $rc -eq 0 ]]; check "$plugin-$profile" $? "exit $rc"
  [[ $out == *"PASS  park_restore"* ]]; check "$plugin-$profile-park-restore" $? "$out"
  # llama-cuda keeps hidden states; gpt-cuda refuses EH_STEP_HIDDEN as an unknown flag
  [[ $out == *"PASS  hidden_state"* ]]; check "$plugin-$profile-hidden-state" $? "$out"
  if [[ $profile == tiny-gemma-3-q4_k_m ]]; then
    # Gemma 3's norms after attention and the MLP need each row-parallel
    # matmul's whole sum: the shard mode refuses it by name
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" --gpus 0,0 2>&1); rc=$?
    [[ $rc -eq 3 && $out == *"llama-cuda: tensor parallelism is not built for gemma3"* ]]
    check "$plugin-$profile-shard-mode-refused" $? "exit $rc: $out"
  elif [[ $plugin == llama-cuda ]]; then
    # The tiny Llama-3.1's attn_output is Q4_K 256 columns wide: two ranks
    # would cut its 256-element blocks in half, so the load is refused by name
    # (H200, 12:37 UTC: it was)
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" --gpus 0,0 2>&1); rc=$?
    [[ $rc -eq 3 && $out == *"tensor 'blk.0.attn_output.weight' (Q4_K) cannot be cut at columns 0..128: not whole blocks of its type"* ]]
    check "$plugin-$profile-shard-mode-refused" $? "exit $rc: $out"
  else
    # gpt-cuda serves one device: a device set is refused by name before its load
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" --gpus 0,0 2>&1); rc=$?
    [[ $rc -eq 3 && $out == *"plugin gpt-cuda serves one device only; 2 were asked for"* ]]
    check "$plugin-$profile-one-device" $? "exit $rc: $out"
  fi
  # The quantized pools (issue 50): the checks above (kv_checks), the type
  # granted and a parked quantized prefix restored bit for bit.
  mapfile -t kv_only < <(kv_checks "$profile")
  for kv in q8_0 fp8; do
    out=$("$check_bin" "$dir/libeh-$plugin.so" --model "$scratch/$profile.gguf" --kv-type $kv "${kv_only[@]}" 2>&1); rc=$?
    echo "$out"
    [[ $rc -eq 0 && $out == *"PASS  kv_cache_type"* && $out == *"PASS  park_restore"* ]]
    check "$plugin-$profile-kv-$kv" $? "exit $rc"
  done
done

# Deep decode steps (kernels.attn_group_min_keys, 2048 by default): at 1 every
# decode step of the grouped-query tiny Llama 3.1 takes RoPE + store and the
# query-group attention instead of the fused kernel; every check, and greedy
# agreement with the CPU reference, must hold as they do with the fused one.
out=$("$check_bin" "$dir/libeh-llama-cuda.so" --model "$scratch/tiny-llama-3.1-q4_k_m.gguf" \
      --reference "$dir/libeh-cpu-reference.so" --engine-options '{"kernels":{"attn_group_min_keys":1}}' 2>&1); rc=$?
echo "$out"
[[ $rc -eq 0 && $out == *"PASS  reference_agreement"* ]]; check llama-cuda-tiny-llama-group-decode $? "exit $rc"
finish
