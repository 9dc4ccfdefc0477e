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

// Bytes of KV cache one token takes: with kv_type 0 (the plugin's default
// cache) what the plugin states (ABI 1.1 eh_model_info.kv_bytes_per_token),
// else an FP16 estimate from the model's hyperparameters; with a kv_type
// (--kv-cache-type) that type's size from the hyperparameters. nullopt when
// none of it is known.
std::optional<uint64_t> kv_bytes_per_token(const model::ModelFile& file, const eh_model_info& info,
                                           uint32_t kv_type = 0);

// The context the server runs with: --ctx-size, else what --kv-cache-size-mb
// holds (in the cache type asked for), else the trained length; never above
// the trained length.
uint32_t choose_context(const model::ModelFile& file, const eh_model_info& info, uint32_t ctx_size,
                        uint64_t kv_cache_mb, uint32_t kv_type = 0);

// The id clients use for the model: the file (or directory) name without
// its extension.
std::string model_id(const std::string& path);

}  // namespace eh::cli
