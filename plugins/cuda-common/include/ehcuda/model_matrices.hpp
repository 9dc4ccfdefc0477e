// A model's weight matrices as the load's log and `engine-host inspect
// --kernels` list them (kernel_route.hpp's route_lines prints their routes),
// read from the file's tensors: one function for the plugin and the host, so
// both list the same shapes. Host code (eh_cuda_plan).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

#include "ehcuda/expert_route.hpp"
#include "ehcuda/kernel_plan.hpp"

namespace ehcuda {

struct DenseMatrixOptions {
    int head_dim = 0;  // the attention's: decode leaves attn_output's input as chunks where it is fused
    // Tensor parallelism: rank 0's rows of Q, of K and of V, and of the FFN
    // (0: the whole model's).
    int q_rows = 0, kv_rows = 0, ff_rows = 0;
    // The line of the kernel that runs a layer's gate|up with its activation
    // at one token (the FFN pair), or "" where gate|up is a matmul. Null:
    // can_implement_pair's verdict, described without the device's choices.
    std::function<std::string(int layer, const GemvShape& gate_up, const GemvShape& down)> ffn_pair;
};

// A llama-family model (llama-cuda's architectures): per layer attn_qkv
// (attn_q/k/v, or phi3's fused attn_qkv split by the head counts),
// attn_output, ffn_gate_up (ffn_gate + ffn_up, or phi3's fused ffn_up),
// ffn_down; then the output head (token_embd when tied). MODEL_LOAD_FAILED
// naming a tensor that is missing or of the wrong rank.
std::vector<MatrixKind> dense_matrices(const ehp::ModelView& view, const KernelPlan& p, const DenseMatrixOptions& o);

struct GptMatrixOptions {
    // A layer's expert forms as the device's predicates say them (gpt-cuda
    // passes its loaded experts' verdicts). Null: expert_forms, from the
    // types and shapes.
    std::function<ExpertForms(int layer, const ExpertLayer& experts)> forms;
};

// A gpt-cuda model (gpt2, gpt-oss, qwen3moe): per layer attn_qkv (GPT-2's
// fused attn_qkv as one matrix, else attn_q/k/v), attn_output (at one token
// its input as chunks from the fused decode attention where the MoE layers'
// head dim takes it); GPT-2's ffn_up and ffn_down; an MoE layer's router
// (ffn_gate_inp) and experts (ffn_gate_up_exps: gate and up, stored fused or
// not; ffn_down_exps); then the output head (token_embd when tied).
// MODEL_LOAD_FAILED naming a tensor that is missing or of the wrong rank.
std::vector<StepMatrix> gpt_matrices(const ehp::ModelView& view, const KernelPlan& p, const GptMatrixOptions& o);

}  // namespace ehcuda
