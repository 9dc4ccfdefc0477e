#include "eh/model/descriptor.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

#include <engine_host/tensor_types.h>

#include "eh/error.hpp"

namespace eh::model {

namespace {

uint32_t clamp32(uint64_t v) { return v > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(v); }

// Per-layer keys (e.g. head_count) may be arrays in some files: take the first
// element, which is what a uniform model repeats.
uint32_t u32_key(const ModelFile& f, const std::string& key) {
    const eh_value* v = f.find(key);
    if (!v) return 0;
    if (v->type == EH_VALUE_ARRAY) {
        auto a = f.get_int_array(key);
        return a && !a->empty() && (*a)[0] > 0 ? clamp32(static_cast<uint64_t>((*a)[0])) : 0;
    }
    return clamp32(f.get_uint(key).value_or(0));
}

std::string upper(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

}  // namespace

const std::vector<std::string>& known_architectures() {
    static const std::vector<std::string> k = {"llama", "qwen2", "qwen2vl", "qwen3", "qwen3moe", "phi3", "gpt2", "gpt-oss", "gemma3"};
    return k;
}

std::string file_type_name(uint32_t ft) {
    // llama_ftype numbering; gaps are types that were removed from ggml.
    static const std::map<uint32_t, const char*> kNames = {
        {0, "F32"},      {1, "F16"},      {2, "Q4_0"},     {3, "Q4_1"},    {4, "Q4_1_SOME_F16"},
        {7, "Q8_0"},     {8, "Q5_0"},     {9, "Q5_1"},     {10, "Q2_K"},   {11, "Q3_K_S"},
        {12, "Q3_K_M"},  {13, "Q3_K_L"},  {14, "Q4_K_S"},  {15, "Q4_K_M"}, {16, "Q5_K_S"},
        {17, "Q5_K_M"},  {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"}, {21, "Q2_K_S"},
        {22, "IQ3_XS"},  {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"}, {26, "IQ3_S"},
        {27, "IQ3_M"},   {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"}, {31, "IQ1_M"},
        {32, "BF16"},    {36, "TQ1_0"},   {37, "TQ2_0"},   {38, "MXFP4_MOE"},
    };
    auto it = kNames.find(ft & ~1024u);
    return it == kNames.end() ? std::string() : std::string(it->second);
}

std::vector<std::string> ModelDescriptor::tensor_type_names() const {
    std::vector<std::string> out;
    for (const auto& t : tensor_types) out.push_back(t.name);
    std::sort(out.begin(), out.end());
    return out;
}

ModelRequirements ModelDescriptor::requirements() const {
    ModelRequirements r;
    r.format = format;
    r.architecture = architecture;
    r.tensor_types = tensor_type_names();
    return r;
}

ModelDescriptor describe(const ModelFile& f) {
    ModelDescriptor d;
    d.format = f.format_name();
    d.architecture = std::string(f.architecture());
    const auto& known = known_architectures();
    d.known_architecture = std::find(known.begin(), known.end(), d.architecture) != known.end();
    d.name = std::string(f.get_string("general.name").value_or(""));
    auto k = [&](const char* suffix) { return f.arch_key(suffix); };

    d.context_length = u32_key(f, k("context_length"));
    d.embedding_length = u32_key(f, k("embedding_length"));
    d.block_count = u32_key(f, k("block_count"));
    d.feed_forward_length = u32_key(f, k("feed_forward_length"));
    d.head_count = u32_key(f, k("attention.head_count"));
    d.head_count_kv = u32_key(f, k("attention.head_count_kv"));
    if (d.head_count_kv == 0) d.head_count_kv = d.head_count;  // GGUF default: no GQA
    d.head_dim = u32_key(f, k("attention.key_length"));
    if (d.head_dim == 0 && d.head_count) d.head_dim = d.embedding_length / d.head_count;
    d.rope_dimension_count = u32_key(f, k("rope.dimension_count"));
    d.rope_freq_base = f.get_float(k("rope.freq_base")).value_or(0);

    auto scaling_type = f.get_string(k("rope.scaling.type"));
    if (scaling_type && *scaling_type != "none") {
        RopeScaling rs;
        rs.type = std::string(*scaling_type);
        rs.factor = f.get_float(k("rope.scaling.factor")).value_or(0);
        rs.original_context_length = u32_key(f, k("rope.scaling.original_context_length"));
        rs.yarn_beta_fast = f.get_float(k("rope.scaling.yarn_beta_fast"));
        rs.yarn_beta_slow = f.get_float(k("rope.scaling.yarn_beta_slow"));
        d.rope_scaling = rs;
    }

    if (auto rms = f.get_float(k("attention.layer_norm_rms_epsilon"))) {
        d.norm_eps = *rms;
        d.norm_is_rms = true;
    } else if (auto ln = f.get_float(k("attention.layer_norm_epsilon"))) {
        d.norm_eps = *ln;
        d.norm_is_rms = false;
    } else {
        d.norm_is_rms = d.architecture != "gpt2";
    }
    d.expert_count = u32_key(f, k("expert_count"));
    d.expert_used_count = u32_key(f, k("expert_used_count"));
    d.expert_feed_forward_length = u32_key(f, k("expert_feed_forward_length"));
    d.sliding_window = u32_key(f, k("attention.sliding_window"));

    const eh_tensor* embd = f.find_tensor("token_embd.weight");
    d.tied_embeddings = embd && !f.find_tensor("output.weight");
    if (uint64_t v = f.get_uint(k("vocab_size")).value_or(0)) d.vocab_size = v;
    else if (auto tok = f.find("tokenizer.ggml.tokens"); tok && tok->type == EH_VALUE_ARRAY) d.vocab_size = tok->count;
    else if (embd && embd->n_dims >= 2) d.vocab_size = embd->dims[1];

    std::map<uint32_t, TensorTypeStat> stats;
    std::map<uint32_t, uint64_t> weight_bytes;  // 2-D+ tensors only: norms and biases are not the "quant"
    for (const eh_tensor& t : f.tensors()) {
        auto& s = stats[t.type];
        s.type = t.type;
        s.count++;
        uint64_t n = 1;
        for (uint32_t i = 0; i < t.n_dims; ++i) n *= t.dims[i];
        s.elements += n;
        s.bytes += t.nbytes;
        d.parameter_count += n;
        d.tensor_bytes += t.nbytes;
        if (t.n_dims >= 2) {
            weight_bytes[t.type] += t.nbytes;
        }
    }
    d.n_tensors = f.tensors().size();
    for (auto& [type, s] : stats) {
        s.name = tensor_type_name(type);
        d.tensor_types.push_back(s);
    }
    std::sort(d.tensor_types.begin(), d.tensor_types.end(), [](const TensorTypeStat& a, const TensorTypeStat& b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.type < b.type;
    });

    if (auto ft = f.get_uint("general.file_type")) {
        d.file_type = clamp32(*ft);
        d.quant_kind = file_type_name(*d.file_type);
    }
    if (d.quant_kind.empty()) {
        // HF checkpoints that pack quantized weights into raw bytes say so in config.json.
        if (auto qm = f.find("hf.quantization_config.quant_method"); qm && qm->type == EH_VALUE_STRING) {
            d.quant_kind = upper(to_sv(qm->v.str));
        } else if (!weight_bytes.empty()) {
            auto best = std::max_element(weight_bytes.begin(), weight_bytes.end(),
                                         [](const auto& a, const auto& b) { return a.second < b.second; });
            d.quant_kind = tensor_type_name(best->first);
        } else if (!d.tensor_types.empty()) {
            d.quant_kind = d.tensor_types.front().name;
        }
    }
    return d;
}

}  // namespace eh::model
