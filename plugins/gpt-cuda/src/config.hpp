// Hyperparameters of a GPT-2, gpt-oss or Qwen3-MoE model, read from
// GGUF-named metadata with the same keys and defaults as the CPU reference
// plugin.
#pragma once

#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

namespace gpt_cuda {

// gpt-oss and qwen3moe share the layer: RMSNorm, attention with RoPE
// (gpt-oss: biases, sinks, a window on even layers; qwen3moe: per-head
// RMSNorm of Q and K), RMSNorm, router, top-k experts.
enum class Arch { Gpt2, GptOss, Qwen3Moe };

struct Config {
    Arch arch = Arch::Gpt2;
    std::string arch_name;
    int n_embd = 0, n_layer = 0, n_head = 0, n_kv = 0, head_dim = 0;
    int n_ff = 0;  // gpt2 MLP width
    int n_vocab = 0;
    int n_ctx_train = 0;
    float eps = 1e-5f;

    // gpt-oss, qwen3moe: rotary embedding (neox pairs), YaRN-blended frequencies and
    // the factor multiplying cos and sin.
    int n_rot = 0;
    std::vector<float> inv_freq;
    float attn_factor = 1.0f;

    int sliding_window = 0;  // gpt-oss: even layers slide, odd layers are full
    bool qk_norm = false;    // qwen3moe: per-head RMSNorm of Q and K before RoPE
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0;
    // The experts' activation (ehcuda/moe.hpp): gpt-oss's clamped SwiGLU,
    // or alpha = kPlainSwiGlu for silu(gate) * up.
    float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;

    bool moe() const { return arch != Arch::Gpt2; }

    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_kv * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
    int layer_window(int layer) const { return sliding_window > 0 && layer % 2 == 0 ? sliding_window : 0; }
};

// Throws ehp::Error(UNSUPPORTED / MODEL_LOAD_FAILED) naming the key.
Config read_config(const ehp::ModelView& view);

// Per-pair inverse frequencies of the rotary embedding (YaRN when factor >
// 1), and the attention factor; exposed for tests.
struct RopeParams {
    int n_rot = 0;
    double freq_base = 10000.0;
    bool yarn = false;
    double factor = 1.0;
    double orig_ctx = 4096;
    double beta_fast = 32.0, beta_slow = 1.0;
    bool truncate = true;
};
std::vector<float> rope_inv_freq(const RopeParams& p, float* attn_factor);

}  // namespace gpt_cuda
