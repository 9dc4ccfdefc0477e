// What a model is, read from the GGUF keys real files use (for an HF
// directory, the keys ModelFile translated config.json into).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eh/model/model_file.hpp"
#include "eh/registry.hpp"

namespace eh::model {

struct RopeScaling {
    std::string type;                      // "yarn", "linear", "longrope", ...
    double factor = 0;                     // 0 when the file gives none
    uint32_t original_context_length = 0;  // 0 when the file gives none
    std::optional<double> yarn_beta_fast;
    std::optional<double> yarn_beta_slow;
};

struct TensorTypeStat {
    uint32_t type = 0;          // eh_tensor_type
    std::string name;           // "Q4_K"
    uint64_t count = 0;         // tensors of this type
    uint64_t elements = 0;
    uint64_t bytes = 0;
};

struct ModelDescriptor {
    std::string format;          // "gguf" / "safetensors"
    std::string architecture;    // "llama", "qwen2", "qwen2vl", "qwen3", "qwen3moe", "phi3", "gpt2", "gpt-oss", "gemma3", or whatever the file says
    bool known_architecture = false;  // one of the nine above
    std::string name;            // general.name, if any

    uint32_t context_length = 0;
    uint32_t embedding_length = 0;
    uint32_t block_count = 0;
    uint32_t feed_forward_length = 0;
    uint32_t head_count = 0;
    uint32_t head_count_kv = 0;
    uint32_t head_dim = 0;              // attention.key_length, else embedding/heads
    uint32_t rope_dimension_count = 0;  // 0 when the file gives none
    double rope_freq_base = 0;          // 0 when the file gives none
    std::optional<RopeScaling> rope_scaling;
    double norm_eps = 0;
    bool norm_is_rms = true;            // false: LayerNorm (gpt2)
    uint32_t expert_count = 0;
    uint32_t expert_used_count = 0;
    uint32_t expert_feed_forward_length = 0;
    uint32_t sliding_window = 0;        // 0 = none
    bool tied_embeddings = false;       // token_embd.weight present, output.weight absent
    uint64_t vocab_size = 0;            // {arch}.vocab_size, else token list length, else embedding rows

    std::optional<uint32_t> file_type;  // general.file_type (llama_ftype), if set
    std::string quant_kind;             // "Q4_K_M", "F16", "MXFP4", ...
    std::vector<TensorTypeStat> tensor_types;  // by bytes, largest first
    uint64_t n_tensors = 0;
    uint64_t parameter_count = 0;       // total elements of all tensors
    uint64_t tensor_bytes = 0;

    // Distinct tensor type names ("F32", "Q4_K", ...), sorted.
    std::vector<std::string> tensor_type_names() const;
    // What the registry needs to pick a plugin.
    ModelRequirements requirements() const;
};

// Never throws for missing keys (fields stay 0); throws eh::Error
// (ModelLoadFailed) when a key has the wrong type.
ModelDescriptor describe(const ModelFile& file);

// Name of a llama_ftype value ("Q4_K_M" for 15), "" for values no one uses.
// The "guessed" flag (1024) is ignored.
std::string file_type_name(uint32_t file_type);

// The architectures this host knows the hyperparameter keys of.
const std::vector<std::string>& known_architectures();

}  // namespace eh::model
