// Synthetic llama/qwen2/qwen3/phi3 models built in memory as an eh_model_view (the
// same thing the host hands a plugin), plus a plain float CPU forward pass
// over the dequantized weights to compare the GPU plugin against.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.h>

namespace ehtest {

struct TinySpec {
    std::string arch = "llama";  // llama | qwen2 | qwen3 | phi3
    int n_embd = 256;
    int n_layer = 2;
    int n_head = 4;
    int n_kv = 2;
    int n_ff = 512;
    int n_vocab = 512;
    int n_rot = 0;  // 0 = head_dim
    int window = 0;
    float freq_base = 10000.0f;
    float eps = 1e-5f;
    bool tied = false;          // no output.weight (qwen2 style)
    uint32_t wtype = 0;         // type of the big matrices (EH_TYPE_*)
    uint32_t embd_type = 0;     // token_embd
    uint32_t out_type = 0;      // output.weight
    std::map<std::string, uint32_t> overrides;  // per-tensor-name type
    uint32_t seed = 1;
    float magnitude = 0.05f;
    bool no_data = false;       // skip generating bytes (shape-only model)
    bool safetensors = false;   // presented as the host's safetensors view: llama Q/K rows in HF order (NEOX rotation)
};

class TinyModel {
public:
    explicit TinyModel(const TinySpec& spec);
    const eh_model_view* view() const { return &view_; }
    const TinySpec& spec() const { return s_; }
    int head_dim() const { return s_.n_embd / s_.n_head; }

    // Logits [n][n_vocab] for every position of `tokens` (teacher forcing).
    std::vector<std::vector<float>> reference_logits(const std::vector<int32_t>& tokens) const;

    // Rounds every F32 matrix (2-D tensor: token_embd, output and the layer
    // matrices; not the norms and biases) to `type`, F16 or BF16: the same
    // checkpoint saved in half precision, as a converter's --outtype f16 /
    // bf16 writes it.
    void round_matrices(uint32_t type);

    // Adds a tensor whose bytes are not backed (for VRAM pre-check tests).
    void add_fake_tensor(const std::string& name, uint32_t type, uint64_t d0, uint64_t d1);

private:
    void add_tensor(const std::string& name, uint32_t type, int cols, int rows, std::mt19937& rng, bool is_norm = false,
                    bool is_bias = false);
    void add_u32(const std::string& key, uint32_t v);
    void add_f32(const std::string& key, float v);
    void finish();
    std::vector<float> matrix(const std::string& name, int& rows, int& cols) const;
    const std::vector<float>& deq(const std::string& name) const;

    TinySpec s_;
    std::deque<std::string> strings_;
    std::deque<std::vector<uint8_t>> blobs_;
    std::vector<eh_tensor> tensors_;
    std::vector<eh_metadata_kv> meta_;
    eh_model_view view_{};
    std::map<std::string, std::vector<float>> dequant_;  // name -> floats (row-major rows x cols)
    std::map<std::string, std::pair<int, int>> shapes_;  // name -> (rows, cols)
};

}  // namespace ehtest
