#include "eh/tools/recipe.hpp"

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"

namespace eh::tools {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

uint32_t block_elems(uint32_t type) { return eh_tensor_type_traits(type).block_elems; }

// llama.cpp's fallback when a row does not split into the chosen type's blocks.
uint32_t fallback(uint32_t type, uint64_t ne0) {
    if (block_elems(type) != 0 && ne0 % block_elems(type) == 0) return type;
    switch (type) {
    case EH_TYPE_Q4_K: type = EH_TYPE_Q5_0; break;
    case EH_TYPE_Q5_K: type = EH_TYPE_Q5_1; break;
    case EH_TYPE_Q6_K: type = EH_TYPE_Q8_0; break;
    default: break;
    }
    if (ne0 % block_elems(type) != 0) type = EH_TYPE_F16;
    return type;
}

// The output head, or the token embedding standing in for it when tied.
bool is_output_like(const ModelFacts& f, std::string_view name) {
    return name == "output.weight" || (!f.has_output && name == "token_embd.weight");
}

uint32_t q4_k_m(const ModelFacts& f, std::string_view name, std::span<const uint64_t> dims) {
    const uint64_t ne0 = dims[0];
    uint32_t t = EH_TYPE_Q4_K;
    const int layer = layer_of(name);
    const int n_layer = static_cast<int>(f.n_layer);
    if (is_output_like(f, name)) {
        // straight to Q8_0 (not via the fallback table) when rows do not split
        t = ne0 % 256 != 0 ? EH_TYPE_Q8_0 : EH_TYPE_Q6_K;
    } else if (contains(name, "attn_v.weight")) {
        if (layer >= 0 && use_more_bits(layer, n_layer)) t = EH_TYPE_Q6_K;
    } else if (contains(name, "ffn_down")) {
        if (layer >= 0 && use_more_bits(layer, n_layer)) t = EH_TYPE_Q6_K;
    } else if (contains(name, "attn_qkv.weight")) {
        t = EH_TYPE_Q5_K;
    }
    return fallback(t, ne0);
}

uint32_t mxfp4_moe(const ModelFacts& f, std::string_view name, std::span<const uint64_t> dims) {
    uint32_t t = EH_TYPE_Q8_0;
    if (!is_output_like(f, name) && dims.size() >= 3 && dims[2] > 1) t = EH_TYPE_MXFP4;
    return fallback(t, dims[0]);
}

struct Named { const char* name; uint32_t type; };
constexpr Named kPlain[] = {
    {"F32", EH_TYPE_F32}, {"F16", EH_TYPE_F16}, {"BF16", EH_TYPE_BF16},
    {"Q4_0", EH_TYPE_Q4_0}, {"Q4_1", EH_TYPE_Q4_1}, {"Q5_0", EH_TYPE_Q5_0}, {"Q5_1", EH_TYPE_Q5_1},
    {"Q8_0", EH_TYPE_Q8_0}, {"Q4_K", EH_TYPE_Q4_K}, {"Q5_K", EH_TYPE_Q5_K}, {"Q6_K", EH_TYPE_Q6_K},
    {"MXFP4", EH_TYPE_MXFP4},
};

std::string upper(std::string_view s) {
    std::string u(s);
    for (char& c : u) if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    return u;
}

}  // namespace

bool use_more_bits(int layer, int n_layers) {
    return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

int layer_of(std::string_view name) {
    if (name.substr(0, 4) != "blk.") return -1;
    int v = 0;
    size_t i = 4;
    if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
    for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) v = v * 10 + (name[i] - '0');
    return (i < name.size() && name[i] == '.') ? v : -1;
}

bool is_quantizable(std::string_view name, std::span<const uint64_t> dims) {
    size_t n_dims = dims.size();
    while (n_dims > 1 && dims[n_dims - 1] == 1) --n_dims;
    if (!ends_with(name, "weight") || n_dims < 2) return false;
    if (contains(name, "_norm.weight")) return false;
    if (contains(name, "ffn_gate_inp.weight")) return false;  // MoE router
    if (name == "position_embd.weight" || name == "token_types.weight") return false;
    return true;
}

uint32_t choose_type(const QuantTarget& target, const ModelFacts& facts, std::string_view name,
                     std::span<const uint64_t> dims, uint32_t source_type) {
    if (!is_quantizable(name, dims)) return source_type;
    switch (target.recipe) {
    case Recipe::Q4_K_M: return q4_k_m(facts, name, dims);
    case Recipe::MXFP4_MOE: return mxfp4_moe(facts, name, dims);
    case Recipe::Plain: break;
    }
    return fallback(target.type, dims[0]);
}

std::string QuantTarget::name() const {
    switch (recipe) {
    case Recipe::Q4_K_M: return "Q4_K_M";
    case Recipe::MXFP4_MOE: return "MXFP4_MOE";
    case Recipe::Plain: break;
    }
    for (const auto& n : kPlain) if (n.type == type) return n.name;
    return fmt::format("type#{}", type);
}

uint32_t QuantTarget::file_type() const {
    switch (recipe) {
    case Recipe::Q4_K_M: return 15;
    case Recipe::MXFP4_MOE: return 38;
    case Recipe::Plain: break;
    }
    switch (type) {
    case EH_TYPE_F32: return 0;
    case EH_TYPE_F16: return 1;
    case EH_TYPE_Q4_0: return 2;
    case EH_TYPE_Q4_1: return 3;
    case EH_TYPE_Q8_0: return 7;
    case EH_TYPE_Q5_0: return 8;
    case EH_TYPE_Q5_1: return 9;
    case EH_TYPE_Q4_K: return 14;  // Q4_K_S: every matrix Q4_K
    case EH_TYPE_Q5_K: return 16;  // Q5_K_S
    case EH_TYPE_Q6_K: return 18;
    case EH_TYPE_BF16: return 32;
    case EH_TYPE_MXFP4: return 38;
    default: return 0;
    }
}

QuantTarget parse_quant_target(std::string_view s) {
    const std::string u = upper(s);
    if (u == "Q4_K_M") return {Recipe::Q4_K_M, EH_TYPE_Q4_K};
    if (u == "MXFP4_MOE") return {Recipe::MXFP4_MOE, EH_TYPE_MXFP4};
    for (const auto& n : kPlain)
        if (u == n.name) return {Recipe::Plain, n.type};
    throw Error(Code::InvalidRequest, fmt::format("unknown quantization type '{}' (accepted: {})", s, quant_target_names()));
}

std::string quant_target_names() {
    std::string out;
    for (const auto& n : kPlain) out += std::string(out.empty() ? "" : ", ") + n.name;
    return out + ", Q4_K_M, MXFP4_MOE";
}

}  // namespace eh::tools
