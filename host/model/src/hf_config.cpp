// config.json -> GGUF metadata. Key names are the ones GGUF files of the same
// architectures carry (llama.cpp's converters wrote the first such files), so
// plugins read one set of keys whatever the source format. Values are not
// changed beyond that renaming; nothing here rewrites tensor data.
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <simdjson.h>

#include "eh/error.hpp"
#include "hf.hpp"

namespace eh::model::detail {

namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

[[noreturn]] void config_fail(const std::string& label, const std::string& what) {
    throw Error(Code::ModelLoadFailed, fmt::format("'{}': {}", label, what));
}

// A JSON value as a metadata value. Arrays become arrays of the common
// element type (numbers: i64 unless any is fractional, then f64); arrays of
// objects or mixed kinds become one string holding the JSON text.
eh_value json_value(ModelData& m, element e);

eh_value string_value(ModelData& m, std::string_view s) {
    eh_value v{};
    v.type = EH_VALUE_STRING;
    v.count = 1;
    v.v.str = m.intern(s);
    return v;
}

eh_value json_array(ModelData& m, simdjson::dom::array a) {
    eh_value v{};
    v.type = EH_VALUE_ARRAY;
    v.count = a.size();
    bool all_int = true, all_num = true, all_str = true, all_bool = true, all_arr = true;
    for (element x : a) {
        element_type t = x.type();
        bool integer = t == element_type::INT64 || t == element_type::UINT64;
        all_int &= integer;
        all_num &= integer || t == element_type::DOUBLE;
        all_str &= t == element_type::STRING;
        all_bool &= t == element_type::BOOL;
        all_arr &= t == element_type::ARRAY;
    }
    size_t i = 0;
    if (v.count == 0) {
        v.elem_type = EH_VALUE_I64;
    } else if (all_int) {
        v.elem_type = EH_VALUE_I64;
        int64_t* p = m.arena.allocate_array<int64_t>(v.count);
        for (element x : a) {
            int64_t n = 0;
            uint64_t u = 0;
            if (x.get(n) == simdjson::SUCCESS) p[i++] = n;
            else p[i++] = x.get(u) == simdjson::SUCCESS ? static_cast<int64_t>(u) : 0;
        }
        v.v.array = p;
    } else if (all_num) {
        v.elem_type = EH_VALUE_F64;
        double* p = m.arena.allocate_array<double>(v.count);
        for (element x : a) {
            double d = 0;
            p[i++] = x.get(d) == simdjson::SUCCESS ? d : 0.0;
        }
        v.v.array = p;
    } else if (all_str) {
        v.elem_type = EH_VALUE_STRING;
        eh_string* p = m.arena.allocate_array<eh_string>(v.count);
        for (element x : a) {
            std::string_view s;
            if (x.get(s) != simdjson::SUCCESS) s = {};
            p[i++] = m.intern(s);
        }
        v.v.array = p;
    } else if (all_bool) {
        v.elem_type = EH_VALUE_BOOL;
        uint8_t* p = m.arena.allocate_array<uint8_t>(v.count);
        for (element x : a) {
            bool b = false;
            p[i++] = x.get(b) == simdjson::SUCCESS && b ? 1 : 0;
        }
        v.v.array = p;
    } else if (all_arr) {
        v.elem_type = EH_VALUE_ARRAY;
        eh_value* p = m.arena.allocate_array<eh_value>(v.count);
        for (element x : a) {
            simdjson::dom::array inner;
            p[i++] = x.get(inner) == simdjson::SUCCESS ? json_array(m, inner) : eh_value{};
        }
        v.v.array = p;
    } else {
        return string_value(m, simdjson::to_string(a));
    }
    return v;
}

eh_value json_value(ModelData& m, element e) {
    eh_value v{};
    v.count = 1;
    switch (e.type()) {
    case element_type::INT64: {
        int64_t x = 0;
        v.type = EH_VALUE_I64;
        v.v.i64 = e.get(x) == simdjson::SUCCESS ? x : 0;
        break;
    }
    case element_type::UINT64: {
        uint64_t x = 0;
        v.type = EH_VALUE_U64;
        v.v.u64 = e.get(x) == simdjson::SUCCESS ? x : 0;
        break;
    }
    case element_type::DOUBLE: {
        double x = 0;
        v.type = EH_VALUE_F64;
        v.v.f64 = e.get(x) == simdjson::SUCCESS ? x : 0.0;
        break;
    }
    case element_type::BOOL: {
        bool x = false;
        v.type = EH_VALUE_BOOL;
        v.v.u64 = e.get(x) == simdjson::SUCCESS && x ? 1 : 0;
        break;
    }
    case element_type::STRING: {
        std::string_view x;
        return string_value(m, e.get(x) == simdjson::SUCCESS ? x : std::string_view());
    }
    case element_type::ARRAY: {
        simdjson::dom::array x;
        if (e.get(x) == simdjson::SUCCESS) return json_array(m, x);
        return string_value(m, "");
    }
    default: return string_value(m, simdjson::to_string(e));  // objects are flattened by the caller
    }
    return v;
}

// Adds "prefix.key" for every leaf under `e`, skipping nulls.
void add_hf(ModelData& m, const std::string& key, element e) {
    if (e.type() == element_type::NULL_VALUE) return;
    simdjson::dom::object o;
    if (e.get(o) == simdjson::SUCCESS) {
        for (auto f : o) add_hf(m, key + "." + std::string(f.key), f.value);
        return;
    }
    m.add_kv(key, json_value(m, e));
}

class Config {
public:
    Config(ModelData& m, simdjson::dom::object root, std::string arch, std::string label)
        : m_(m), root_(root), arch_(std::move(arch)), label_(std::move(label)) {}

    // The value of `key` unless it is absent or null.
    std::optional<element> get(simdjson::dom::object o, std::string_view key) const {
        element e;
        if (o[key].get(e) != simdjson::SUCCESS || e.type() == element_type::NULL_VALUE) return std::nullopt;
        return e;
    }
    std::optional<element> get(std::string_view key) const { return get(root_, key); }

    std::optional<uint64_t> uint_of(std::optional<element> e, std::string_view key) const {
        if (!e) return std::nullopt;
        uint64_t u;
        if (e->get(u) != simdjson::SUCCESS)
            config_fail(label_, fmt::format("config key '{}' is not a non-negative integer", key));
        return u;
    }
    std::optional<double> float_of(std::optional<element> e, std::string_view key) const {
        if (!e) return std::nullopt;
        double d;
        if (e->get(d) != simdjson::SUCCESS) config_fail(label_, fmt::format("config key '{}' is not a number", key));
        return d;
    }

    // "{arch}.suffix" = u32 config[key]; returns the value.
    std::optional<uint64_t> u32(std::string_view key, std::string_view suffix) {
        auto v = uint_of(get(key), key);
        consumed_.insert(std::string(key));
        if (v) {
            if (*v > UINT32_MAX) config_fail(label_, fmt::format("config key '{}' = {} is too large", key, *v));
            m_.set_u32(fmt::format("{}.{}", arch_, suffix), static_cast<uint32_t>(*v));
        }
        return v;
    }
    std::optional<double> f32(std::string_view key, std::string_view suffix) {
        auto v = float_of(get(key), key);
        consumed_.insert(std::string(key));
        if (v) m_.set_f32(fmt::format("{}.{}", arch_, suffix), static_cast<float>(*v));
        return v;
    }
    void set_u32(std::string_view suffix, uint64_t v) {
        m_.set_u32(fmt::format("{}.{}", arch_, suffix), static_cast<uint32_t>(v));
    }

    // A token id (or the first of a list) as tokenizer.ggml.<what>_token_id.
    void token_id(std::string_view key, std::string_view gguf_key) {
        auto e = get(key);
        if (!e) return;
        uint64_t id;
        if (e->get(id) == simdjson::SUCCESS) {
            consumed_.insert(std::string(key));
        } else {
            // A list (several eos ids): the first becomes the GGUF key, the
            // whole list stays under hf.<key>.
            simdjson::dom::array a;
            if (e->get(a) != simdjson::SUCCESS || a.size() == 0 || a.at(0).get(id) != simdjson::SUCCESS) return;
        }
        if (id <= UINT32_MAX) m_.set_u32(gguf_key, static_cast<uint32_t>(id));
    }

    void consume(std::string_view key) { consumed_.insert(std::string(key)); }

    void rest_as_hf() {
        for (auto f : root_)
            if (!consumed_.count(std::string(f.key))) add_hf(m_, "hf." + std::string(f.key), f.value);
    }

    ModelData& m_;
    simdjson::dom::object root_;
    std::string arch_;
    std::string label_;
    std::set<std::string> consumed_;
};

// `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5,
// which also moves rope_theta there); rope_type "default" is no scaling.
void translate_rope_object(Config& c, const std::string& obj_key, std::optional<element> e) {
    if (!e) return;
    simdjson::dom::object rs;
    if (e->get(rs) != simdjson::SUCCESS) config_fail(c.label_, fmt::format("config key '{}' is not an object", obj_key));
    std::string key_prefix = c.arch_ + ".rope.scaling.";
    std::set<std::string> done;
    std::string_view type;
    if (auto t = c.get(rs, "rope_type"); t && t->get(type) == simdjson::SUCCESS) done.insert("rope_type");
    else if (auto t2 = c.get(rs, "type"); t2 && t2->get(type) == simdjson::SUCCESS) done.insert("type");
    // Qwen2-VL's "mrope" is plain RoPE over three position axes: its
    // mrope_section stays hf.*.mrope_section for the plugins (ehp::mrope).
    if (!type.empty() && type != "default" && type != "mrope") c.m_.set_string(key_prefix + "type", type);
    if (auto theta = c.float_of(c.get(rs, "rope_theta"), "rope_theta")) {
        c.m_.set_f32(c.arch_ + ".rope.freq_base", static_cast<float>(*theta));
        done.insert("rope_theta");
    }
    auto f32 = [&](std::string_view k, const char* suffix) {
        if (auto v = c.float_of(c.get(rs, k), k)) {
            c.m_.set_f32(key_prefix + suffix, static_cast<float>(*v));
            done.insert(std::string(k));
        }
    };
    f32("factor", "factor");
    f32("beta_fast", "yarn_beta_fast");
    f32("beta_slow", "yarn_beta_slow");
    f32("attention_factor", "attn_factor");
    auto orig = c.uint_of(c.get(rs, "original_max_position_embeddings"), "original_max_position_embeddings");
    if (!orig) orig = c.uint_of(c.get("original_max_position_embeddings"), "original_max_position_embeddings");
    if (orig) {
        c.m_.set_u32(key_prefix + "original_context_length", static_cast<uint32_t>(*orig));
        done.insert("original_max_position_embeddings");
        c.consume("original_max_position_embeddings");
    }
    for (auto f : rs)
        if (!done.count(std::string(f.key))) add_hf(c.m_, fmt::format("hf.{}.{}", obj_key, f.key), f.value);
}

void translate_rope_object(Config& c, const char* obj_key) {
    c.consume(obj_key);
    translate_rope_object(c, obj_key, c.get(obj_key));
}

void translate_rope_scaling(Config& c) {
    translate_rope_object(c, "rope_scaling");
    translate_rope_object(c, "rope_parameters");
}

// Gemma 3 (model_type gemma3_text, or a gemma3 config's text_config).
// Its configs leave out what Gemma3TextConfig defaults (the 4B's text_config
// gives only five keys), so the defaults are written here, before the
// common keys: the first value of a key is the one kept. Global layers keep
// rope_theta / rope_scaling; sliding layers have rope_local_base_freq, or in
// transformers 5 rope_parameters holds one object per layer type.
void translate_gemma3_first(Config& c) {
    auto absent = [&](std::string_view k) { return !c.get(k); };
    if (absent("num_attention_heads")) c.set_u32("attention.head_count", 8);
    if (absent("num_key_value_heads")) c.set_u32("attention.head_count_kv", 4);
    if (absent("head_dim")) {
        for (const char* k : {"attention.key_length", "attention.value_length", "rope.dimension_count"}) c.set_u32(k, 256);
    }
    if (absent("rms_norm_eps")) c.m_.set_f32(c.arch_ + ".attention.layer_norm_rms_epsilon", 1e-6f);
    if (absent("max_position_embeddings")) c.set_u32("context_length", 131072);
    if (absent("sliding_window")) c.set_u32("attention.sliding_window", 4096);
    c.f32("rope_local_base_freq", "rope.freq_base_swa");
    c.u32("sliding_window_pattern", "attention.sliding_window_pattern");
    c.f32("final_logit_softcapping", "final_logit_softcapping");
    const double qpas = c.float_of(c.get("query_pre_attn_scalar"), "query_pre_attn_scalar").value_or(256.0);
    c.consume("query_pre_attn_scalar");
    if (!(qpas > 0.0) || !std::isfinite(qpas)) config_fail(c.label_, "config key 'query_pre_attn_scalar' must be > 0");
    c.m_.set_f32(c.arch_ + ".attention.scale", static_cast<float>(1.0 / std::sqrt(qpas)));
    simdjson::dom::object rp;
    if (auto e = c.get("rope_parameters"); e && e->get(rp) == simdjson::SUCCESS && c.get(rp, "full_attention")) {
        c.consume("rope_parameters");
        translate_rope_object(c, "rope_parameters.full_attention", c.get(rp, "full_attention"));
        simdjson::dom::object local;
        if (auto l = c.get(rp, "sliding_attention"); l && l->get(local) == simdjson::SUCCESS) {
            if (auto theta = c.float_of(c.get(local, "rope_theta"), "rope_theta"))
                c.m_.set_f32(c.arch_ + ".rope.freq_base_swa", static_cast<float>(*theta));
            std::string_view type;
            if (auto t = c.get(local, "rope_type"); t && t->get(type) == simdjson::SUCCESS && type != "default")
                config_fail(c.label_, fmt::format("rope_parameters.sliding_attention.rope_type '{}' is not supported "
                                                  "(Gemma 3's sliding layers rotate without scaling)", type));
        }
    }
}

}  // namespace

std::string hf_architecture(std::string_view model_type) {
    if (model_type == "gpt_oss") return "gpt-oss";
    // Mistral is llama with its own head_dim (Mistral-Nemo: 128 with 5120
    // hidden / 32 heads); llama.cpp's converter writes it as llama too.
    if (model_type == "mistral") return "llama";
    if (model_type == "qwen3_moe") return "qwen3moe";
    if (model_type == "gemma3_text") return "gemma3";
    // Qwen2-VL / Qwen2.5-VL (and their text configs): llama.cpp's converter
    // writes both decoders as qwen2vl.
    if (model_type == "qwen2_5_vl" || model_type == "qwen2_vl" || model_type == "qwen2_5_vl_text" ||
        model_type == "qwen2_vl_text")
        return "qwen2vl";
    return std::string(model_type);  // llama, qwen2, qwen3, phi3, gpt2 keep their names
}

std::string translate_hf_config(ModelData& m, std::string_view text, const std::string& label) {
    simdjson::padded_string json(text);
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (auto err = parser.parse(json).get(root))
        config_fail(label, fmt::format("not valid JSON: {}", simdjson::error_message(err)));
    simdjson::dom::object obj;
    if (root.get(obj)) config_fail(label, "not a JSON object");
    std::string_view model_type;
    if (obj["model_type"].get(model_type)) config_fail(label, "has no string 'model_type'");
    std::string arch = hf_architecture(model_type);
    // Gemma3ForConditionalGeneration, and Qwen2(.5)-VL as transformers 5
    // writes it: the decoder's settings are its text_config; the token ids
    // stay at the top. (transformers 4 wrote Qwen2.5-VL's flat.)
    const simdjson::dom::object outer = obj;
    simdjson::dom::object text_config;
    const bool nested = (model_type == "gemma3" || arch == "qwen2vl") &&
                        obj["text_config"].get(text_config) == simdjson::SUCCESS;
    if (nested) obj = text_config;

    m.set_string("general.architecture", arch);
    m.set_string("general.source_format", "safetensors");
    Config c(m, obj, arch, label);
    c.consume("model_type");
    std::string_view name;
    if (auto e = c.get("_name_or_path"); e && e->get(name) == simdjson::SUCCESS && !name.empty()) {
        m.set_string("general.name", name);
        c.consume("_name_or_path");
    }

    if (arch == "gpt2") {
        auto ctx = c.u32("n_positions", "context_length");
        if (!ctx) c.u32("n_ctx", "context_length");
        else c.consume("n_ctx");
        auto embd = c.u32("n_embd", "embedding_length");
        c.u32("n_layer", "block_count");
        auto heads = c.u32("n_head", "attention.head_count");
        if (!c.u32("n_inner", "feed_forward_length") && embd) c.set_u32("feed_forward_length", 4 * *embd);
        if (heads) c.set_u32("attention.head_count_kv", *heads);
        c.f32("layer_norm_epsilon", "attention.layer_norm_epsilon");
    } else {
        if (arch == "gemma3") translate_gemma3_first(c);
        c.u32("max_position_embeddings", "context_length");
        auto embd = c.u32("hidden_size", "embedding_length");
        c.u32("num_hidden_layers", "block_count");
        auto ff = c.u32("intermediate_size", "feed_forward_length");
        auto heads = c.u32("num_attention_heads", "attention.head_count");
        if (!c.u32("num_key_value_heads", "attention.head_count_kv") && heads)
            c.set_u32("attention.head_count_kv", *heads);
        c.f32("rms_norm_eps", "attention.layer_norm_rms_epsilon");
        c.f32("rope_theta", "rope.freq_base");
        auto head_dim = c.u32("head_dim", "attention.key_length");
        if (head_dim) c.set_u32("attention.value_length", *head_dim);
        else if (embd && heads && *heads) head_dim = *embd / *heads;
        if (head_dim && arch != "gpt-oss") {
            double partial = c.float_of(c.get("partial_rotary_factor"), "partial_rotary_factor").value_or(1.0);
            c.consume("partial_rotary_factor");
            c.set_u32("rope.dimension_count", static_cast<uint64_t>(static_cast<double>(*head_dim) * partial));
        }
        // Qwen2 configs carry a sliding_window that is off unless use_sliding_window says so.
        bool swa = true;
        if (arch == "qwen2" || arch == "qwen2vl" || arch == "qwen3" || arch == "qwen3moe") {
            bool on = false;
            auto e = c.get("use_sliding_window");
            swa = e && e->get(on) == simdjson::SUCCESS && on;
        }
        if (swa) c.u32("sliding_window", "attention.sliding_window");
        if (arch == "gpt-oss") {
            c.u32("num_local_experts", "expert_count");
            if (c.u32("num_experts_per_tok", "expert_used_count")) c.consume("experts_per_token");
            else c.u32("experts_per_token", "expert_used_count");
            if (ff) c.set_u32("expert_feed_forward_length", *ff);
        } else if (arch == "qwen3moe") {
            // norm_topk_prob, decoder_sparse_step and mlp_only_layers stay
            // hf.* for the plugins to check (ehp::qwen3moe_unsupported)
            c.u32("num_experts", "expert_count");
            c.u32("num_experts_per_tok", "expert_used_count");
            c.u32("moe_intermediate_size", "expert_feed_forward_length");
        } else {
            if (c.get("num_local_experts")) c.u32("num_local_experts", "expert_count");
            if (c.get("num_experts_per_tok")) c.u32("num_experts_per_tok", "expert_used_count");
        }
        c.u32("vocab_size", "vocab_size");
        translate_rope_scaling(c);
        if (arch == "gemma3") c.m_.set_f32("gemma3.rope.freq_base", 1000000.0f);  // Gemma3TextConfig's rope_theta
    }
    if (arch == "gpt2") c.u32("vocab_size", "vocab_size");
    c.token_id("bos_token_id", "tokenizer.ggml.bos_token_id");
    c.token_id("eos_token_id", "tokenizer.ggml.eos_token_id");
    c.token_id("pad_token_id", "tokenizer.ggml.padding_token_id");
    c.rest_as_hf();
    if (nested) {
        Config top(m, outer, arch, label);
        top.token_id("bos_token_id", "tokenizer.ggml.bos_token_id");
        top.token_id("eos_token_id", "tokenizer.ggml.eos_token_id");
        top.token_id("pad_token_id", "tokenizer.ggml.padding_token_id");
    }
    return arch;
}

}  // namespace eh::model::detail
