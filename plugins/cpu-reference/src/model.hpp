// A loaded model: hyperparameters read from the GGUF-named metadata of the
// host's view, and weights bound to the tensors the view points at.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <engine_host/mrope.hpp>
#include <engine_host/plugin_abi.h>

#include "ops.hpp"
#include "thread_pool.hpp"
#include "weights.hpp"

namespace cpuref {

enum class Arch { Llama, Qwen2, Qwen3, Qwen3Moe, Phi3, Gpt2, GptOss, Gemma3 };

enum class FfnKind {
    SwiGlu,       // down(silu(gate(x)) * up(x))            llama, qwen2, qwen3
    SwiGluFused,  // up has 2*n_ff rows: gate rows first     phi3
    Gelu,         // down(gelu_tanh(up(x)))                  gpt2
    GeluGated,    // down(gelu_tanh(gate(x)) * up(x))        gemma3
    MoeOai,       // routed experts with clamped SwiGLU      gpt-oss
    MoeSwiGlu     // routed experts, down(silu(gate) * up)    qwen3moe
};

inline bool is_moe(FfnKind f) { return f == FfnKind::MoeOai || f == FfnKind::MoeSwiGlu; }

struct Config {
    Arch arch = Arch::Llama;
    std::string arch_name;
    bool from_safetensors = false;
    uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    uint32_t n_ff = 0, n_vocab = 0, n_ctx_train = 0;
    float norm_eps = 1e-5f;
    bool layer_norm = false;  // LayerNorm with bias instead of RMSNorm
    FfnKind ffn = FfnKind::SwiGlu;
    RopeConfig rope;
    uint32_t sliding_window = 0;   // tokens; 0 = none
    bool swa_alternating = false;  // gpt-oss: even layers slide, odd are full
    uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
    // gemma3: the embedding row times sqrt(n_embd); q times attn_scale
    // (0 = 1/sqrt(head_dim)); the logits soft-capped (0 = not); the
    // sliding layers' own rotation (rope_swa, no scaling).
    float embd_scale = 1.0f;
    float attn_scale = 0.0f;
    float logit_softcap = 0.0f;
    RopeConfig rope_swa;
    // qwen2vl: the rotation's frequencies split among time, row and column
    // (M-RoPE); inactive for every other architecture.
    ehp::mrope::Sections mrope;
};

struct Layer {
    std::vector<float> attn_norm, attn_norm_b;
    Matrix wq, wk, wv, wqkv, wo;
    std::vector<float> bq, bk, bv, bqkv, bo;
    std::vector<float> q_norm, k_norm;  // per-head RMSNorm weights (head_dim), qwen3
    std::vector<float> sinks;          // per query head, gpt-oss
    std::vector<float> attn_post_norm;  // RMSNorm of the attention output before the residual, gemma3
    std::vector<float> ffn_norm, ffn_norm_b;
    std::vector<float> ffn_post_norm;   // RMSNorm of the FFN output before the residual, gemma3
    Matrix w_gate, w_up, w_down;
    std::vector<float> b_gate, b_up, b_down;
    Matrix router;                      // {n_embd, n_expert}
    std::vector<float> router_b;
    Matrix gate_exps, up_exps, down_exps;   // gate/up may be parts of one fused tensor
    std::vector<float> gate_exps_b, up_exps_b, down_exps_b;
    uint32_t window = 0;                // sliding window of this layer; 0 = full
    bool local_rope = false;            // rotates with the model's rope_swa tables (gemma3 sliding layers)
};

class Model {
public:
    // Reads and validates everything; throws ehp::Error with a message naming
    // the key or tensor. The view must outlive the model.
    Model(const eh_load_params& params);

    const Config& config() const { return cfg_; }
    const std::vector<Layer>& layers() const { return layers_; }
    const RopeTables& rope() const { return rope_; }
    const RopeTables& rope(const Layer& L) const { return L.local_rope ? rope_swa_ : rope_; }
    ThreadPool& pool() const { return *pool_; }
    const eh_model_view* view() const { return view_; }

    const Matrix& token_embd() const { return token_embd_; }
    const Matrix& position_embd() const { return position_embd_; }
    const Matrix& output() const { return output_; }
    const std::vector<float>& output_norm() const { return output_norm_; }
    const std::vector<float>& output_norm_b() const { return output_norm_b_; }

    std::string dominant_type() const { return dominant_type_; }
    uint64_t host_bytes() const { return host_bytes_; }
    std::string device_name() const;

private:
    const eh_model_view* view_;
    Config cfg_;
    RopeTables rope_, rope_swa_;
    std::unique_ptr<ThreadPool> pool_;
    std::vector<Layer> layers_;
    Matrix token_embd_, position_embd_, output_;
    std::vector<float> output_norm_, output_norm_b_;
    std::string dominant_type_;
    uint64_t host_bytes_ = 0;
};

// Qwen3's QK-norm: each head of q (n_head per token) and k (n_head_kv) is
// RMS-normalised with the layer's q_norm / k_norm weights, before RoPE. A
// no-op for layers without them. q and k hold T tokens of n_head*head_dim /
// n_head_kv*head_dim floats.
void apply_qk_norm(const Config& c, const Layer& L, float* q, float* k, size_t T);

// An expert's activation of its gate and up outputs: gpt-oss's clamped
// SwiGLU, or plain silu(gate) * up (qwen3moe).
float expert_activation(const Config& c, float gate, float up);

// "CPU (N threads)"
std::string cpu_device_name(unsigned n_threads);

}  // namespace cpuref
