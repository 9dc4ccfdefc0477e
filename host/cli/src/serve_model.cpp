#include "serve_model.hpp"

#include "eh/model/descriptor.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

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

std::optional<uint64_t> kv_bytes_per_token(const model::ModelFile& file, const eh_model_info& info, uint32_t kv_type) {
    if (info.kv_bytes_per_token && kv_type == 0) return info.kv_bytes_per_token;
    model::ModelDescriptor d = model::describe(file);
    if (!d.block_count || !d.head_dim || !d.head_count) {
        // the plugin's own figure is of its default cache: more than a smaller type takes
        if (info.kv_bytes_per_token) return info.kv_bytes_per_token;
        return std::nullopt;
    }
    const uint64_t kv_heads = d.head_count_kv ? d.head_count_kv : d.head_count;
    const uint64_t values = 2ull * d.block_count * kv_heads * d.head_dim;  // K and V
    const eh_type_traits t = eh_tensor_type_traits(kv_type ? kv_type : uint32_t(EH_TYPE_F16));
    if (!t.block_elems) return std::nullopt;
    return (values * t.block_bytes + t.block_elems - 1) / t.block_elems;
}

uint32_t choose_context(const model::ModelFile& file, const eh_model_info& info, uint32_t ctx_size,
                        uint64_t kv_cache_mb, uint32_t kv_type) {
    const uint32_t trained = info.context_length;
    if (ctx_size) {
        if (trained && ctx_size > trained)
            throw Error(Code::InvalidRequest, fmt::format("--ctx-size {} exceeds the model's trained context length {}",
                                                          ctx_size, trained));
        return ctx_size;
    }
    if (kv_cache_mb) {
        auto per = kv_bytes_per_token(file, info, kv_type);
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
