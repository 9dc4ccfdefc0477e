#!/usr/bin/env bash
# `engine-host inspect --kernels`: the CUDA kernel routes of a model's weight
# matrices from the kernel plan, without a GPU, on forged files of real
# layouts at toy size (Phi-3's fused QKV and gate|up, Qwen3's head dim 128;
# gpt-cuda's gpt-oss, Qwen3-MoE and GPT-2).
# Usage: inspect_kernels_test.sh ENGINE_HOST
source "$(dirname "$0")/testlib.sh"
eh=$1

for p in tiny-phi-3-q4_k_m tiny-qwen3-q4_k_m tiny-qwen3-moe-q4_k_m tiny-gemma-3-q4_k_m tiny-gpt-oss-mxfp4 tiny-gpt2-f16; do
  "$eh" forge --like "$p" --out "$scratch/$p.gguf" >"$scratch/forge.log" 2>&1 || { cat "$scratch/forge.log"; exit 1; }
done
phi=$scratch/tiny-phi-3-q4_k_m.gguf qwen3=$scratch/tiny-qwen3-q4_k_m.gguf moe=$scratch/tiny-qwen3-moe-q4_k_m.gguf
gemma=$scratch/tiny-gemma-3-q4_k_m.gguf oss=$scratch/tiny-gpt-oss-mxfp4.gguf gpt2=$scratch/tiny-gpt2-f16.gguf

# The default device is named as such; one line per kind at one token.
expect default-device 0 'device +sm_90, 132 multiprocessors \(the default' -- "$eh" inspect --model "$phi" --kernels
expect plan-line 0 'plan +kernel plan: sm_90, 132 SMs; GEMV input int16, bulk copy GEMV, PDL' -- "$eh" inspect --model "$phi" --kernels
# Phi-3's fused QKV is one matrix of 3 x 256 rows; its gate|up the FFN pair.
expect phi-qkv 0 'batch 1 +attn_qkv x4: Q[0-9A-Z_]+ 768x256: gemv_bulk_kernel: 1 rows/tile, 4 warps/block, 192 blocks, int16 input' -- "$eh" inspect --model "$phi" --kernels
expect phi-pair 0 'ffn_gate_up x4: Q4_K 512x256: gate_up_pair_kernel with SwiGLU' -- "$eh" inspect --model "$phi" --kernels
# 8 tokens: one single-token call each; 64: cuBLAS; 4 with FP16 mirrors: cuBLAS.
expect batch-8 0 'batch 8 +attn_qkv x1: 8 single-token calls \(side streams\), each Q4_K 512x256 \+ Q4_K 256x256 \+ Q4_K 256x256: gemv_bulk_kernel' -- "$eh" inspect --model "$qwen3" --kernels --batch 1,8,64
# 2 .. 3 tokens: the bulk kernels' token groups (the plan's bulk_max_tokens), one
# call, each weight chunk decoded once; inputs of 256 columns staged in each block
expect batch-2 0 'batch 2 +attn_qkv x1: Q4_K 512x256 \+ Q4_K 256x256 \+ Q4_K 256x256: 2 tokens: gemv_bulk_ring_kernel: [^;]*int16 input, weights decoded once$' -- "$eh" inspect --model "$qwen3" --kernels --batch 2
expect batch-3 0 'batch 3 +attn_qkv x1: Q4_K 512x256 \+ Q4_K 256x256 \+ Q4_K 256x256: 3 tokens: gemv_bulk' -- "$eh" inspect --model "$qwen3" --kernels --batch 3 --fp16-mirrors
expect batch-64 0 'batch 64 +attn_qkv x1: .*cuBLAS GEMM on FP16 weights.*, 64 tokens' -- "$eh" inspect --model "$qwen3" --kernels --batch 1,8,64
expect mirrored 0 'batch 4 +attn_qkv x1: .*cuBLAS GEMM' -- "$eh" inspect --model "$qwen3" --kernels --batch 4 --fp16-mirrors
expect not-mirrored 0 'batch 4 +attn_qkv x1: 4 single-token calls' -- "$eh" inspect --model "$qwen3" --kernels --batch 4
# Qwen3's head dim 128: the fused attention leaves attn_output's input as chunks.
expect chunks 0 'attn_output x2: Q4_K 256x512: gemv_bulk_kernel: .*input chunks from the producer' -- "$eh" inspect --model "$qwen3" --kernels
# Before sm_90: the register kernel.
expect sm80 0 'attn_output x2: Q4_K 256x512: gemv_kernel: 1 rows/warp, int16 input, input chunks' -- "$eh" inspect --model "$qwen3" --kernels --kernel-device sm_80:108
expect sm80-named 0 'device +sm_80, 108 multiprocessors \(--kernel-device\)' -- "$eh" inspect --model "$qwen3" --kernels --kernel-device sm_80:108
# JSON: the steps with their routes.
expect json 0 '"steps": ?\[\{"routes": ?\[' -- "$eh" inspect --model "$qwen3" --kernels --batch 1,8 --json
# Gemma 3: the same pair kernel with its GeLU(tanh) gate.
expect gemma-pair 0 'ffn_gate_up x[0-9]+: .*: gate_up_pair_kernel with GeLU\(tanh\) gate' -- "$eh" inspect --model "$gemma" --kernels
# gpt-cuda's models: its plan (int16x2 input for exact routing), the
# router's own kernel and the one-token expert kernels at one token, the
# grouped experts' forms by the step's average pairs an expert.
expect oss-plan 0 'plan +kernel plan: sm_90, 132 SMs; GEMV input int16x2' -- "$eh" inspect --model "$oss" --kernels
expect oss-router 0 'ffn_gate_inp \(router\) x2: F32 4x64: router_decode_kernel' -- "$eh" inspect --model "$oss" --kernels
expect oss-decode 0 'ffn_gate_up_exps x2: MXFP4 64x64 \+ MXFP4 64x64 an expert, 4 experts, top-2: moe_decode: gate_up_pair_kernel.*routing fused into it' -- "$eh" inspect --model "$oss" --kernels
# 64 x top-2 over 4 experts: 32 an expert, MXFP4 passes of 32 tokens; 2048: the tile form
expect oss-64 0 'ffn_gate_up_exps x2: .*moe_grouped after route_kernel \(top-k\): 64 x top-2 = 128 pairs, 32 an expert if spread evenly.*tensor-core passes of 32 tokens' -- "$eh" inspect --model "$oss" --kernels --batch 64
expect oss-tiles 0 'ffn_down_exps x2: MXFP4 64x64 an expert.*: tile form' -- "$eh" inspect --model "$oss" --kernels --batch 2048
expect moe-down 0 'ffn_down_exps x1: Q6_K 256x256 an expert, 8 experts, top-2: moe_decode: down_decode_kernel' -- "$eh" inspect --model "$moe" --kernels
expect moe-8 0 'ffn_gate_up_exps x2: Q4_K 256x256 \+ Q4_K 256x256 an expert, 8 experts, top-2: moe_grouped .*16 pairs, 2 an expert if spread evenly.*tensor-core passes of 8 tokens' -- "$eh" inspect --model "$moe" --kernels --batch 8
# the mirrors do not move gpt-cuda's cuBLAS threshold
expect moe-mirrors 0 'batch 3 +attn_qkv x1: 3 single-token calls' -- "$eh" inspect --model "$moe" --kernels --batch 3 --fp16-mirrors
expect moe-json 0 '"steps": ?\[\{"routes": ?\[".*ffn_gate_up_exps' -- "$eh" inspect --model "$moe" --kernels --json
# Qwen2.5-VL's decoder (qwen2vl) is llama-cuda's too: qwen2's matrices.
"$eh" forge --like tiny-qwen2.5-vl-q4_k_m --out "$scratch/vl.gguf" --mmproj-out "$scratch/vl-mmproj.gguf" >"$scratch/forge.log" 2>&1 || { cat "$scratch/forge.log"; exit 1; }
expect vl-routes 0 'batch 1 +attn_qkv x[0-9]+: ' -- "$eh" inspect --model "$scratch/vl.gguf" --kernels
# GPT-2: its fused attn_qkv one matrix, the MLP's up and down
expect gpt2-qkv 0 'batch 1 +attn_qkv x2: F16 192x64: gemv_kernel' -- "$eh" inspect --model "$gpt2" --kernels
expect gpt2-mlp 0 'ffn_up x2: 8 single-token calls \(side streams\), each F16 256x64: gemv_kernel' -- "$eh" inspect --model "$gpt2" --kernels --batch 8
# The plan's override applies, as in the plugin; a bad one is refused by name.
expect plan-env 0 'plan +kernel plan: sm_90, 132 SMs; GEMV input float, register GEMV' -- env EHCUDA_PLAN='{"gemv_input": "float", "gemv_bulk": false}' "$eh" inspect --model "$phi" --kernels
expect plan-env-bad 2 'EHCUDA_PLAN: "pair_slots" must be an integer in \[0, 4\]' -- env EHCUDA_PLAN='{"pair_slots": 9}' "$eh" inspect --model "$phi" --kernels
# stories260K (head dim 8, a 172-wide FFN): ffn_down's columns are not whole
# 32-element chunks, the generic kernel's.
expect stories 0 'ffn_down x5: F32 64x172: gemv_generic_kernel' -- "$eh" inspect --model "$EH_TESTDATA_DIR/models/stories260K.gguf" --kernels
# A file without the tensors: named, exit 4.
expect missing-tensor 4 "error: --kernels: missing tensor 'blk.0.attn_q.weight' \[MODEL_LOAD_FAILED\]" -- "$eh" inspect --model "$EH_TESTDATA_DIR/vocab/ggml-vocab-llama-spm.gguf" --kernels
# Bad arguments.
expect batch-bad 2 '--batch must be 1 to 16 token counts' -- "$eh" inspect --model "$phi" --kernels --batch 0
expect batch-junk 2 '--batch must be 1 to 16 token counts' -- "$eh" inspect --model "$phi" --kernels --batch 1,x
expect batch-many 2 '--batch must be 1 to 16 token counts' -- "$eh" inspect --model "$phi" --kernels --batch 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17
expect device-bad 2 '--kernel-device must be sm_XY:SMS' -- "$eh" inspect --model "$phi" --kernels --kernel-device h100
expect batch-alone 2 '--batch, --kernel-device and --fp16-mirrors go with --kernels' -- "$eh" inspect --model "$phi" --batch 8
# Without --kernels, no section.
out=$("$eh" inspect --model "$phi" 2>&1)
if grep -q '^Kernels:' <<<"$out"; then echo "FAIL no-kernels: a Kernels section without --kernels"; fails=$((fails + 1)); else passes=$((passes + 1)); fi

finish
