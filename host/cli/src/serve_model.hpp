// Model-side startup for `engine-host serve`: what the model needs from a
// plugin, and the context size the server runs with.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "eh/model/model_file.hpp"
#include "eh/registry.hpp"

namespace eh::cli {

ModelRequirements model_requirements(const model::ModelFile& file);

// Bytes of KV cache one token takes: what the plugin states (ABI 1.1
// eh_model_info.kv_bytes_per_token), else an FP16 estimate from the model's
// hyperparameters; nullopt when neither is known.
std::optional<uint64_t> kv_bytes_per_token(const model::ModelFile& file, const eh_model_info& info);

// The context the server runs with: --ctx-size, else what --kv-cache-size-mb
// holds, else the trained length; never above the trained length.
uint32_t choose_context(const model::ModelFile& file, const eh_model_info& info, uint32_t ctx_size,
                        uint64_t kv_cache_mb);

// The id clients use for the model: the file (or directory) name without
// its extension.
std::string model_id(const std::string& path);

}  // namespace eh::cli
