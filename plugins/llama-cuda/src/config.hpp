// Hyperparameters of a llama-family model, read from GGUF-named metadata.
#pragma once

#include <string>
#include <vector>

#include <engine_host/mrope.hpp>
#include <engine_host/plugin_abi.hpp>

namespace llama_cuda {

struct Config {
    std::string arch;  // "llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen2vl"
    int n_embd = 0;
    int n_layer = 0;
    int n_head = 0;
    int n_kv = 0;
    int head_dim = 0;
    int n_rot = 0;
    int n_ff = 0;
    int n_vocab = 0;
    int n_ctx_train = 0;
    float eps = 1e-5f;
    float freq_base = 10000.0f;
    bool neox = false;  // qwen2, qwen3, phi3: rotate halves; llama: adjacent pairs
    bool qk_norm = false;  // qwen3, gemma3: per-head RMSNorm of Q and K before RoPE
    int window = 0;     // sliding window (0 = full attention): every layer's, or the sliding layers' below
    // qwen2vl (Qwen2.5-VL's decoder: qwen2's tensors): the M-RoPE sections
    // (engine_host/mrope.hpp); inactive for every other architecture.
    ehp::mrope::Sections mrope;

    // Gemma 3 (engine_host/gemma3.hpp has the rules every plugin shares):
    // norms after attention and after the MLP (added to the residual once
    // normalised), the GeLU(tanh)-gated MLP, the embedding times sqrt(hidden).
    bool gemma = false;
    float embd_scale = 1.0f;
    float attn_scale = 0.0f;     // the q.k factor; 0: 1/sqrt(head_dim)
    float logit_softcap = 0.0f;  // cap * tanh(logit / cap) on the LM head's output; 0: none
    float rope_linear = 1.0f;    // global layers: linear RoPE scaling (positions / factor)
    float local_freq_base = 10000.0f;  // sliding layers' RoPE base (no scaling)
    // Per layer, whether it slides (window, local base); empty: every layer
    // takes `window` and `freq_base`.
    std::vector<bool> sliding;

    int layer_window(int layer) const { return sliding.empty() ? window : sliding[size_t(layer)] ? window : 0; }
    bool layer_local(int layer) const { return !sliding.empty() && sliding[size_t(layer)]; }
    float layer_freq_base(int layer) const { return layer_local(layer) ? local_freq_base : freq_base; }
    float scale() const;

    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_kv * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Throws ehp::Error(UNSUPPORTED / MODEL_LOAD_FAILED) naming the key.
Config read_config(const ehp::ModelView& view);

}  // namespace llama_cuda
