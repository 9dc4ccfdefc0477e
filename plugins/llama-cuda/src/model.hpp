// A loaded model: configuration plus every weight in one device arena, kept
// in its stored type.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ehcuda/device_memory.hpp>
#include <ehcuda/graph.hpp>
#include <ehcuda/kernels.hpp>
#include <ehcuda/lora.hpp>
#include <ehcuda/sharded_model.hpp>
#include <ehcuda/vision_gemma3.hpp>
#include <ehcuda/vision_qwen.hpp>
#include <ehcuda/weight_mirror.hpp>

#include "config.hpp"

namespace llama_cuda {

// The most ranks one load may have (eh_plugin_info.max_devices).
inline constexpr int kMaxDevices = 8;

struct Layer {
    const float* attn_norm = nullptr;
    ehcuda::MatSeg qkv[3];  // fused attn_qkv (1) or attn_q, attn_k, attn_v (3)
    int n_qkv = 0;
    const float* q_norm = nullptr;  // qwen3, gemma3: head_dim weights of the per-head RMSNorm
    const float* k_norm = nullptr;
    ehcuda::WeightRef attn_out;
    const float* ffn_norm = nullptr;
    ehcuda::MatSeg gate_up[2];  // ffn_gate + ffn_up, or fused ffn_up (gate|up)
    int n_gate_up = 0;
    ehcuda::WeightRef ffn_down;
    // gemma3: the norms of the attention's and the MLP's output, before
    // each is added to the residual.
    const float* post_attn_norm = nullptr;
    const float* post_ffn_norm = nullptr;
};

// One rank of a tensor-parallel load (the scheme: cuda-common README,
// "Tensor parallelism"): its query and KV heads, its FFN rows, and its
// layers' matrices, which are that rank's slices alone, in an arena of its
// own on its GPU with its own copy of the norm weights and RoPE divisors.
struct Shard {
    Config c;       // n_head, n_kv and n_ff are this rank's; the rest the model's
    int device = 0; // its GPU
    int head0 = 0;  // its first query head
    int kv0 = 0;    // its first KV head
    int ff0 = 0;    // its first FFN row
    std::vector<Layer> layers;
    ehcuda::DeviceArena arena;
    ehcuda::WeightMirror mirror;      // FP16 copies of its matrices (when the model keeps them)
    const float* rope_freqs = nullptr;  // Model::rope_freqs' copy on its GPU
};

// (sharded_model.hpp: its GPU and ranks, device memory, kernel plan and
// adapters)
struct Model : ehcuda::ShardedModel<Shard> {
    Config cfg;
    ehcuda::WeightRef tok_embd;
    const float* output_norm = nullptr;
    ehcuda::WeightRef output;  // LM head (the embedding table when tied)
    // n_rot/2 per-pair RoPE divisors, else null: Llama 3.x's, or Gemma 3's
    // linear scaling (every pair by the factor; global layers only).
    const float* rope_freqs = nullptr;
    std::vector<Layer> layers;
    // Whether it keeps FP16 mirrors: batched steps then take cuBLAS from
    // the plan's batch_gemv_per_token_mirrored + 1 tokens (3), not
    // batch_gemv_per_token + 1 (9) (ehcuda::route_step_matmul).
    bool mirrored = false;
    // ABI 1.6: Gemma 3's image encoder once image_encoder_load ran (its
    // device memory on `ledger`, declared before it).
    std::unique_ptr<ehcuda::Gemma3Vision> vision;
    // ABI 1.8: Qwen2.5-VL's (qwen2vl models only), likewise.
    std::unique_ptr<ehcuda::QwenVlVision> qwen_vision;
};

// A layer's gate and up as two matrices (phi3 stores them as one: gate's
// n_ff rows, then up's).
inline void gate_up_halves(const Layer& L, int n_ff, ehcuda::MatSeg& gate, ehcuda::MatSeg& up) {
    if (L.n_gate_up == 2) {
        gate = L.gate_up[0];
        up = L.gate_up[1];
        return;
    }
    gate = L.gate_up[0];
    gate.w.rows = n_ff;
    up = gate;
    up.w.data = static_cast<const uint8_t*>(gate.w.data) + size_t(n_ff) * gate.w.row_bytes;
    if (gate.bias) up.bias = gate.bias + n_ff;
}

// The RoPE divisors of a layer: none on Gemma 3's sliding layers (rank
// r's copy on its GPU when sharded, r >= 0).
inline const float* layer_rope_freqs(const Model& m, int layer, int rank = -1) {
    if (m.cfg.layer_local(layer)) return nullptr;
    return rank >= 0 && !m.shards.empty() ? m.shards[size_t(rank)].rope_freqs : m.rope_freqs;
}

// RoPE of ntok rows of qkv (the fused [q | k | v] buffer) with this
// model's rotation at `layer`; the caller names the cache and the positions.
inline ehcuda::RopeArgs rope_args(const Model& m, float* qkv, int ntok, int layer) {
    const Config& c = m.cfg;
    ehcuda::RopeArgs r;
    r.qkv = qkv;
    r.ld = c.qkv_dim();
    r.n_head = c.n_head;
    r.n_kv = c.n_kv;
    r.head_dim = c.head_dim;
    r.n_rot = c.n_rot;
    r.neox = c.neox;
    r.freq_base = c.layer_freq_base(layer);
    r.freq_factors = layer_rope_freqs(m, layer);
    r.ntok = ntok;
    return r;
}

// Validates every tensor, checks free memory (INSUFFICIENT_VRAM), allocates
// and uploads. Progress and cancel come from the load params.
std::unique_ptr<Model> load_model(const eh_load_params& params);

}  // namespace llama_cuda
