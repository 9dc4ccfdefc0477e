#include "serve_model.hpp"

#include "eh/model/descriptor.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "eh/error.hpp"

namespace eh::cli {

ModelRequirements model_requirements(const model::ModelFile& file) {
    ModelRequirements need;
    need.format = file.format_name();
    need.architecture = std::string(file.architecture());
    std::set<std::string> types;
    for (const auto& t : file.tensors()) types.insert(model::tensor_type_name(t.type));
    need.tensor_types.assign(types.begin(), types.end());
    return need;
}

std::optional<uint64_t> kv_bytes_per_token(const model::ModelFile& file, const eh_model_info& info) {
    if (info.kv_bytes_per_token) return info.kv_bytes_per_token;
    model::ModelDescriptor d = model::describe(file);
    if (!d.block_count || !d.head_dim || !d.head_count) return std::nullopt;
    uint64_t kv_heads = d.head_count_kv ? d.head_count_kv : d.head_count;
    return 2ull * d.block_count * kv_heads * d.head_dim * 2ull;  // K and V, 2 bytes each
}

uint32_t choose_context(const model::ModelFile& file, const eh_model_info& info, uint32_t ctx_size,
                        uint64_t kv_cache_mb) {
    const uint32_t trained = info.context_length;
    if (ctx_size) {
        if (trained && ctx_size > trained)
            throw Error(Code::InvalidRequest, fmt::format("--ctx-size {} exceeds the model's trained context length {}",
                                                          ctx_size, trained));
        return ctx_size;
    }
    if (kv_cache_mb) {
        auto per = kv_bytes_per_token(file, info);
        if (!per) throw Error(Code::InvalidRequest, "--kv-cache-size-mb: the model does not state its attention shape; use --ctx-size");
        uint64_t n = kv_cache_mb * 1024 * 1024 / *per;
        if (n < 16) throw Error(Code::InvalidRequest, fmt::format("--kv-cache-size-mb {} holds only {} tokens", kv_cache_mb, n));
        return uint32_t(std::min<uint64_t>(n, trained ? trained : n));
    }
    return trained;
}

std::string model_id(const std::string& path) {
    std::filesystem::path p(path);
    if (p.filename().empty()) p = p.parent_path();
    std::string stem = p.filename().string();
    if (p.has_extension() && p.extension() == ".gguf") stem = p.stem().string();
    return stem.empty() ? "model" : stem;
}

}  // namespace eh::cli
