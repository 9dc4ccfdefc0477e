// Hyperparameters of a llama-family model, read from GGUF-named metadata.
#pragma once

#include <string>

#include <engine_host/plugin_abi.hpp>

namespace llama_cuda {

struct Config {
    std::string arch;  // "llama", "qwen2", "qwen3", "phi3"
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
    bool qk_norm = false;  // qwen3: per-head RMSNorm of Q and K before RoPE
    int window = 0;     // sliding window (0 = full attention)

    int q_dim() const { return n_head * head_dim; }
    int kv_dim() const { return n_kv * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// Throws ehp::Error(UNSUPPORTED / MODEL_LOAD_FAILED) naming the key.
Config read_config(const ehp::ModelView& view);

}  // namespace llama_cuda
