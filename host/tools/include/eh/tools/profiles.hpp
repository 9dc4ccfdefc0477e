// Model profiles for the forge: the hyperparameters, metadata keys, tensor
// names, shapes and per-tensor types of a real model file, so that a forged
// file has exactly the real file's layout with seeded random weights.
// docs/forge.md lists every profile and the census each one produces.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "eh/model/gguf_writer.hpp"
#include "eh/tools/recipe.hpp"

namespace eh::tools {

// How a tensor's values are drawn (before quantization).
enum class Init {
    Normal,   // N(0, scale²)
    Ones,     // 1 + N(0, scale²): norm weights
    Values,   // TensorSpec::values as given (Llama 3's rope_freqs)
};

struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;  // ggml order
    uint32_t type = 0;           // eh_tensor_type in the file
    Init init = Init::Normal;
    float scale = 0.02f;
    std::vector<float> values;   // Init::Values: every element, in order
};

// Where the tokenizer comes from and the special ids the real file carries.
struct VocabSpec {
    std::string default_source;  // path relative to the shared testdata dir
    std::string pre;             // tokenizer.ggml.pre when built from tokenizer.json
    std::vector<std::pair<std::string, model::GgufValue>> extra;  // special ids, add_bos, ...
};

struct Profile {
    std::string name;           // "qwen2.5-0.5b-instruct-q4_k_m"
    std::string arch;           // general.architecture
    std::string description;
    bool tiny = false;          // small enough for CI
    uint64_t n_vocab = 0;       // rows of the embedding (padded vocab size)
    QuantTarget target;
    // general.* and {arch}.* keys, in file order (tokenizer keys come from the vocab).
    std::vector<std::pair<std::string, model::GgufValue>> metadata;
    VocabSpec vocab;
    // Builds the tensor list for a vocabulary of n_vocab rows.
    std::vector<TensorSpec> tensors(uint64_t n_vocab) const;

    // hparams the tensor builder needs
    struct Shape {
        uint32_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
        uint32_t n_ctx = 0, n_expert = 0, n_expert_used = 0;
        bool tied = false;       // no output.weight
        bool qkv_bias = false;   // qwen2
        bool qk_norm = false;    // qwen3: attn_q_norm / attn_k_norm per layer
    } shape;
    std::vector<float> rope_freqs;  // Llama 3.x: rope_freqs.weight (n_rot/2 divisors), else empty
    // Control tokens written over [PAD] entries of the vocabulary (id, text):
    // a vision profile's image tokens.
    std::vector<std::pair<uint64_t, std::string>> control_tokens;
    // A Gemma 3 vision tower is forged beside the model (forge's --mmproj-out).
    bool vision = false;
};

// Every profile name, real ones first.
std::vector<std::string> profile_names();
// Throws eh::Error(InvalidRequest) naming the known profiles.
Profile find_profile(const std::string& name);

// Tensor-type census: type name -> number of tensors.
std::map<std::string, int> census(const std::vector<TensorSpec>& tensors);

}  // namespace eh::tools
