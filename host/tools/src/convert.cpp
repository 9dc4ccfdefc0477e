#include "eh/tools/convert.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <engine_host/rope_scaling.hpp>
#include <engine_host/tensor_types.h>

#include "eh/error.hpp"
#include "eh/file_text.hpp"
#include "eh/model/gguf_writer.hpp"
#include "eh/model/hf_names.hpp"
#include "eh/tools/parallel.hpp"
#include "eh/tools/safetensors.hpp"
#include "eh/tools/vocab.hpp"
#include "convert_plan.hpp"
#include "row_stream.hpp"

namespace eh::tools {

namespace fs = std::filesystem;
using model::GgufValue;
using nlohmann::json;

namespace {

json read_json(const fs::path& p) {
    std::string text = read_text_file(p);
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': invalid JSON: {}", p.string(), e.what()));
    }
}

// A config key present (not null) with a value of the wrong kind;
// from_config names the file.
struct ConfigKeyType {
    std::string key, want, got;
};

bool present(const json& c, const char* key) { return c.contains(key) && !c[key].is_null(); }

// The first of `keys` present; each must be a u32.
uint32_t cfg_u32(const json& c, std::initializer_list<const char*> keys, const std::string& file) {
    for (const char* k : keys) {
        if (!present(c, k)) continue;
        if (!c[k].is_number_unsigned() || c[k].get<uint64_t>() > UINT32_MAX)
            throw ConfigKeyType{k, "an integer from 0 to 4294967295", c[k].dump()};
        return c[k].get<uint32_t>();
    }
    throw Error(Code::ModelLoadFailed, fmt::format("'{}': missing integer '{}'", file, *keys.begin()));
}
double cfg_f(const json& c, const char* key, double dflt) {
    if (!present(c, key)) return dflt;
    if (!c[key].is_number()) throw ConfigKeyType{key, "a number", c[key].dump()};
    return c[key].get<double>();
}

std::string arch_of(const json& cfg, const std::string& file) {
    const std::string mt = cfg.value("model_type", "");
    if (mt == "mistral") return "llama";
    if (mt == "gemma3_text" || (mt == "gemma3" && cfg.contains("text_config") && cfg["text_config"].is_object()))
        return "gemma3";
    if (mt == "llama" || mt == "qwen2" || mt == "qwen3" || mt == "qwen3_moe" || mt == "phi3" || mt == "gpt2" ||
        mt == "gpt_oss")
        return model::hf_model_type_to_arch(mt);
    throw Error(Code::InvalidRequest, fmt::format("'{}': model_type '{}' is not supported (llama, mistral, qwen2, qwen3, "
                                                  "qwen3_moe, phi3, gpt2, gpt_oss, gemma3_text, gemma3)",
                                                  file, mt));
}

// A Qwen3-MoE config the qwen3moe GGUF layout cannot express (llama.cpp
// computes every such file with every layer sparse and the top-k weights
// renormalised), refused rather than converted into another model; the
// same rule as the plugins' ehp::qwen3moe_unsupported.
void check_qwen3moe(const json& cfg, const std::string& file) {
    const auto refuse = [&](const std::string& why) {
        throw Error(Code::InvalidRequest, fmt::format("'{}': {} is not supported by the qwen3moe GGUF layout", file, why));
    };
    if (cfg.contains("norm_topk_prob") && cfg["norm_topk_prob"].is_boolean() && !cfg["norm_topk_prob"].get<bool>())
        refuse("norm_topk_prob false");
    if (cfg.contains("decoder_sparse_step") && cfg["decoder_sparse_step"] != 1)
        refuse(fmt::format("decoder_sparse_step {}", cfg["decoder_sparse_step"].dump()));
    if (cfg.contains("mlp_only_layers") && !(cfg["mlp_only_layers"].is_array() && cfg["mlp_only_layers"].empty()))
        refuse("mlp_only_layers (dense layers)");
}

// Rotary parameters: transformers 5 keeps them in "rope_parameters"
// (rope_theta included), older configs in "rope_scaling" + "rope_theta".
const json* rope_params(const json& cfg) {
    for (const char* k : {"rope_parameters", "rope_scaling"})
        if (cfg.contains(k) && cfg[k].is_object()) return &cfg[k];
    return nullptr;
}
double rope_theta(const json& cfg, double dflt) {
    if (present(cfg, "rope_theta")) return cfg_f(cfg, "rope_theta", dflt);
    if (const json* rp = rope_params(cfg)) return cfg_f(*rp, "rope_theta", dflt);
    return dflt;
}

// rope.scaling.* keys for linear and YaRN scaling. Llama 3.x's "llama3"
// becomes what llama.cpp's converter writes for it: no scaling type, and a
// rope_freqs.weight tensor of per-pair divisors (returned; n_rot/2 values).
// Other kinds (longrope) are refused.
std::vector<float> rope_scaling(model::GgufWriter& w, const std::string& arch, const json& cfg, uint32_t ctx,
                                uint32_t n_rot, const std::string& file) {
    const std::string a = arch + ".";
    const json* rp = rope_params(cfg);
    if (!rp) return {};
    const std::string type = rp->value("rope_type", rp->value("type", std::string("default")));
    if (type == "default") return {};
    if (type == "llama3" && arch == "llama") {
        ehp::Llama3Rope p;
        p.factor = cfg_f(*rp, "factor", p.factor);
        p.low_freq_factor = cfg_f(*rp, "low_freq_factor", p.low_freq_factor);
        p.high_freq_factor = cfg_f(*rp, "high_freq_factor", p.high_freq_factor);
        p.original_context = cfg_f(*rp, "original_max_position_embeddings", p.original_context);
        if (!(p.factor > 0) || !(p.low_freq_factor > 0) || !(p.high_freq_factor > p.low_freq_factor) ||
            !(p.original_context > 0) || n_rot < 2 || n_rot % 2)
            throw Error(Code::InvalidRequest, fmt::format("'{}': llama3 rope parameters out of range (factor {}, "
                                                          "low_freq_factor {}, high_freq_factor {}, original {})",
                                                          file, p.factor, p.low_freq_factor, p.high_freq_factor,
                                                          p.original_context));
        return ehp::llama3_rope_factors(n_rot, rope_theta(cfg, 500000), p);
    }
    if (type != "linear" && type != "yarn")
        throw Error(Code::InvalidRequest, fmt::format("'{}': rope type '{}' is not supported (default, linear, yarn, "
                                                      "llama3 for llama)",
                                                      file, type));
    w.set(a + "rope.scaling.type", GgufValue::string(type));
    w.set(a + "rope.scaling.factor", GgufValue::f32(float(cfg_f(*rp, "factor", 1.0))));
    if (type == "yarn") {
        uint32_t orig = ctx;
        if (rp->contains("original_max_position_embeddings") && (*rp)["original_max_position_embeddings"].is_number_integer())
            orig = (*rp)["original_max_position_embeddings"].get<uint32_t>();
        w.set(a + "rope.scaling.original_context_length", GgufValue::u32(orig));
    }
    return {};
}

struct Hparams {
    uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_vocab = 0, head_dim = 0;
    uint32_t n_expert = 0;  // qwen3moe
    std::vector<float> rope_freqs;  // llama3 rope scaling: rope_freqs.weight
};

// Gemma 3's keys, with Gemma3TextConfig's defaults for what a config
// leaves out (the 4B's text_config gives five keys). Beyond what llama.cpp's
// converter writes: the per-layer pattern when the config lists layer types
// or a period other than 6, and attention.scale from query_pre_attn_scalar
// (llama.cpp derives the scale from the layer count; engine-host's plugins
// read the key).
Hparams gemma3_hparams(model::GgufWriter& w, const json& cfg, const std::string& file) {
    auto u = [&](const char* k, uint32_t dflt) { return present(cfg, k) ? cfg_u32(cfg, {k}, file) : dflt; };
    Hparams h;
    h.n_layer = cfg_u32(cfg, {"num_hidden_layers"}, file);
    h.n_embd = cfg_u32(cfg, {"hidden_size"}, file);
    h.n_head = u("num_attention_heads", 8);
    h.n_head_kv = u("num_key_value_heads", 4);
    h.head_dim = u("head_dim", 256);
    h.n_vocab = u("vocab_size", 262208);
    if (h.n_head == 0 || h.n_head_kv == 0 || h.n_head % h.n_head_kv != 0 || h.head_dim == 0 || h.n_layer == 0)
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': layers, head counts ({} / {}) or head_dim {} invalid", file,
                                                       h.n_head, h.n_head_kv, h.head_dim));
    if (present(cfg, "attn_logit_softcapping"))
        throw Error(Code::InvalidRequest, fmt::format("'{}': attn_logit_softcapping is not supported by the gemma3 layout", file));
    const std::string a = "gemma3.";
    const uint32_t ctx = u("max_position_embeddings", 131072);
    w.set(a + "context_length", GgufValue::u32(ctx));
    w.set(a + "embedding_length", GgufValue::u32(h.n_embd));
    w.set(a + "block_count", GgufValue::u32(h.n_layer));
    w.set(a + "feed_forward_length", GgufValue::u32(cfg_u32(cfg, {"intermediate_size"}, file)));
    w.set(a + "attention.head_count", GgufValue::u32(h.n_head));
    w.set(a + "attention.head_count_kv", GgufValue::u32(h.n_head_kv));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(float(cfg_f(cfg, "rms_norm_eps", 1e-6))));
    w.set(a + "attention.key_length", GgufValue::u32(h.head_dim));
    w.set(a + "attention.value_length", GgufValue::u32(h.head_dim));
    // transformers 5: one rope object per layer type; before: rope_theta,
    // rope_scaling and rope_local_base_freq
    json global = cfg, local = json::object();
    if (cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object() &&
        cfg["rope_parameters"].contains("full_attention")) {
        global = json{{"rope_parameters", cfg["rope_parameters"]["full_attention"]}};
        if (cfg["rope_parameters"].contains("sliding_attention")) local = cfg["rope_parameters"]["sliding_attention"];
    }
    w.set(a + "rope.freq_base", GgufValue::f32(float(rope_theta(global, 1000000))));
    if (local.is_object() && local.value("rope_type", std::string("default")) != "default")
        throw Error(Code::InvalidRequest, fmt::format("'{}': a scaled RoPE on the sliding layers is not supported", file));
    w.set(a + "rope.freq_base_swa",
          GgufValue::f32(float(present(local, "rope_theta") ? cfg_f(local, "rope_theta", 10000)
                                                            : cfg_f(cfg, "rope_local_base_freq", 10000))));
    w.set(a + "attention.sliding_window", GgufValue::u32(u("sliding_window", 4096)));
    if (cfg.contains("layer_types") && cfg["layer_types"].is_array()) {
        const json& lt = cfg["layer_types"];
        if (lt.size() != h.n_layer)
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': layer_types lists {} layers, not {}", file, lt.size(), h.n_layer));
        std::vector<uint8_t> slide;
        for (const auto& t : lt) {
            if (!t.is_string() || (t != "sliding_attention" && t != "full_attention"))
                throw Error(Code::ModelLoadFailed, fmt::format("'{}': layer_types entry {} is not sliding_attention or "
                                                               "full_attention", file, t.dump()));
            slide.push_back(t == "sliding_attention" ? 1 : 0);
        }
        w.set(a + "attention.sliding_window_pattern", GgufValue::numeric_array(EH_VALUE_BOOL, slide.data(), slide.size()));
    } else if (const uint32_t period = u("sliding_window_pattern", 6); period != 6) {
        w.set(a + "attention.sliding_window_pattern", GgufValue::u32(period));
    }
    const double qpas = cfg_f(cfg, "query_pre_attn_scalar", 256);
    if (!(qpas > 0)) throw Error(Code::InvalidRequest, fmt::format("'{}': query_pre_attn_scalar must be > 0", file));
    w.set(a + "attention.scale", GgufValue::f32(float(1.0 / std::sqrt(qpas))));
    if (present(cfg, "final_logit_softcapping"))
        w.set(a + "final_logit_softcapping", GgufValue::f32(float(cfg_f(cfg, "final_logit_softcapping", 0))));
    h.rope_freqs = rope_scaling(w, "gemma3", global, ctx, h.head_dim, file);
    return h;
}

// config.json -> the {arch}.* keys llama.cpp's converter writes.
Hparams write_hparams(model::GgufWriter& w, const std::string& arch, const json& cfg, const std::string& cfg_file) {
    if (arch == "gemma3") return gemma3_hparams(w, cfg, cfg_file);
    Hparams h;
    h.n_layer = cfg_u32(cfg, {"num_hidden_layers", "n_layer"}, cfg_file);
    h.n_embd = cfg_u32(cfg, {"hidden_size", "n_embd"}, cfg_file);
    h.n_head = cfg_u32(cfg, {"num_attention_heads", "n_head"}, cfg_file);
    h.n_head_kv = cfg.contains("num_key_value_heads") ? cfg_u32(cfg, {"num_key_value_heads"}, cfg_file) : h.n_head;
    h.n_vocab = cfg_u32(cfg, {"vocab_size"}, cfg_file);
    if (h.n_head == 0 || h.n_head_kv == 0 || h.n_head % h.n_head_kv != 0)
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': head counts {} / {} are invalid", cfg_file, h.n_head, h.n_head_kv));
    h.head_dim = cfg.contains("head_dim") && cfg["head_dim"].is_number_integer() ? cfg["head_dim"].get<uint32_t>()
                                                                                 : h.n_embd / h.n_head;
    const std::string a = arch + ".";
    if (arch == "gpt2") {
        w.set(a + "block_count", GgufValue::u32(h.n_layer));
        w.set(a + "context_length", GgufValue::u32(cfg_u32(cfg, {"n_ctx", "n_positions"}, cfg_file)));
        w.set(a + "embedding_length", GgufValue::u32(h.n_embd));
        w.set(a + "feed_forward_length",
              GgufValue::u32(cfg.contains("n_inner") && cfg["n_inner"].is_number() ? cfg["n_inner"].get<uint32_t>() : 4 * h.n_embd));
        w.set(a + "attention.head_count", GgufValue::u32(h.n_head));
        w.set(a + "attention.layer_norm_epsilon", GgufValue::f32(float(cfg_f(cfg, "layer_norm_epsilon", 1e-5))));
        return h;
    }
    const uint32_t ctx = cfg_u32(cfg, {"max_position_embeddings"}, cfg_file);
    const uint32_t ff = cfg_u32(cfg, {"intermediate_size"}, cfg_file);
    if (arch == "phi3") {
        w.set(a + "context_length", GgufValue::u32(ctx));
        w.set(a + "rope.scaling.original_context_length",
              GgufValue::u32(cfg.contains("original_max_position_embeddings") ? cfg_u32(cfg, {"original_max_position_embeddings"}, cfg_file) : ctx));
        w.set(a + "embedding_length", GgufValue::u32(h.n_embd));
        w.set(a + "feed_forward_length", GgufValue::u32(ff));
        w.set(a + "block_count", GgufValue::u32(h.n_layer));
    } else {
        w.set(a + "block_count", GgufValue::u32(h.n_layer));
        w.set(a + "context_length", GgufValue::u32(ctx));
        w.set(a + "embedding_length", GgufValue::u32(h.n_embd));
        w.set(a + "feed_forward_length", GgufValue::u32(ff));
    }
    w.set(a + "attention.head_count", GgufValue::u32(h.n_head));
    w.set(a + "attention.head_count_kv", GgufValue::u32(h.n_head_kv));
    if (arch == "phi3") {
        w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(float(cfg_f(cfg, "rms_norm_eps", 1e-5))));
        w.set(a + "rope.dimension_count", GgufValue::u32(h.n_embd / h.n_head));
        w.set(a + "rope.freq_base", GgufValue::f32(float(rope_theta(cfg, 10000))));
        if (cfg.contains("sliding_window") && cfg["sliding_window"].is_number_integer())
            w.set(a + "attention.sliding_window", GgufValue::u32(cfg["sliding_window"].get<uint32_t>()));
        return h;
    }
    w.set(a + "rope.freq_base", GgufValue::f32(float(rope_theta(cfg, arch == "gpt-oss" ? 150000 : 10000))));
    w.set(a + "attention.layer_norm_rms_epsilon", GgufValue::f32(float(cfg_f(cfg, "rms_norm_eps", 1e-6))));
    if (arch == "llama") {
        w.set(a + "rope.dimension_count", GgufValue::u32(h.head_dim));
        // a config's own head_dim (Mistral-Nemo: 128 with 5120 hidden / 32
        // heads) goes into the file, as llama.cpp's converter writes it
        if (cfg.contains("head_dim")) {
            w.set(a + "attention.key_length", GgufValue::u32(h.head_dim));
            w.set(a + "attention.value_length", GgufValue::u32(h.head_dim));
        }
    }
    if (arch == "qwen3" || arch == "qwen3moe") {
        // head_dim is its own (128 with 2048 hidden / 32 heads in Qwen3-30B-A3B)
        w.set(a + "attention.key_length", GgufValue::u32(h.head_dim));
        w.set(a + "attention.value_length", GgufValue::u32(h.head_dim));
    }
    if (arch == "qwen3moe") {
        check_qwen3moe(cfg, cfg_file);
        h.n_expert = cfg_u32(cfg, {"num_experts"}, cfg_file);
        const uint32_t used = cfg_u32(cfg, {"num_experts_per_tok"}, cfg_file);
        if (h.n_expert == 0 || used == 0 || used > h.n_expert)
            throw Error(Code::ModelLoadFailed, fmt::format("'{}': num_experts_per_tok {} of num_experts {}", cfg_file, used, h.n_expert));
        w.set(a + "expert_count", GgufValue::u32(h.n_expert));
        w.set(a + "expert_used_count", GgufValue::u32(used));
        w.set(a + "expert_feed_forward_length", GgufValue::u32(cfg_u32(cfg, {"moe_intermediate_size"}, cfg_file)));
    }
    if (arch == "gpt-oss") {
        // gpt-oss's head_dim (64) is not hidden_size / heads (2880 / 64).
        w.set(a + "attention.key_length", GgufValue::u32(h.head_dim));
        w.set(a + "attention.value_length", GgufValue::u32(h.head_dim));
        w.set(a + "rope.dimension_count", GgufValue::u32(h.head_dim));
        w.set(a + "expert_count", GgufValue::u32(cfg_u32(cfg, {"num_local_experts"}, cfg_file)));
        w.set(a + "expert_used_count", GgufValue::u32(cfg_u32(cfg, {"num_experts_per_tok", "experts_per_token"}, cfg_file)));
        w.set(a + "expert_feed_forward_length", GgufValue::u32(ff));
        w.set(a + "attention.sliding_window", GgufValue::u32(cfg_u32(cfg, {"sliding_window"}, cfg_file)));
    }
    if (arch != "phi3") h.rope_freqs = rope_scaling(w, arch, cfg, ctx, h.head_dim, cfg_file);
    return h;
}

// A config.json key of the wrong JSON type (a string where a number goes,
// say) is the caller's error, named with the file, not an internal one.
template <class F>
auto from_config(const std::string& file, F&& f) {
    try {
        return f();
    } catch (const ConfigKeyType& k) {
        throw Error(Code::InvalidRequest, fmt::format("'{}': key '{}' must be {}, not {}", file, k.key, k.want,
                                                      k.got.substr(0, 64)));
    } catch (const json::exception& e) {
        throw Error(Code::InvalidRequest, fmt::format("'{}': a key has the wrong type ({})", file, e.what()));
    }
}

}  // namespace

ConvertResult convert_hf(const ConvertOptions& o) {
    const fs::path dir(o.hf_dir);
    const std::string cfg_file = (dir / "config.json").string();
    const json top = read_json(cfg_file);
    const std::string arch = from_config(cfg_file, [&] { return arch_of(top, cfg_file); });
    // Gemma3ForConditionalGeneration: the decoder's settings are its
    // text_config; token ids absent there are taken from the top.
    json cfg = top;
    if (arch == "gemma3" && top.contains("text_config") && top["text_config"].is_object()) {
        cfg = top["text_config"];
        for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
            if (!cfg.contains(k) && top.contains(k)) cfg[k] = top[k];
    }
    const auto st = read_safetensors_dir(o.hf_dir);

    model::GgufWriter w;
    w.set("general.architecture", GgufValue::string(arch));
    w.set("general.type", GgufValue::string("model"));
    w.set("general.name", GgufValue::string(dir.filename().string()));
    const Hparams hp = from_config(cfg_file, [&] { return write_hparams(w, arch, cfg, cfg_file); });
    w.set("general.file_type", GgufValue::u32(o.target.file_type()));

    // the tensors first: a problem with one is named before the vocabulary is read
    const bool tied =
        from_config(cfg_file, [&] { return cfg.value("tie_word_embeddings", arch == "gpt2" || arch == "gemma3"); });
    PlanInput in{arch, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_expert, tied, o.log};
    const std::vector<Planned> plan = plan_tensors(in, st);

    // tokenizer
    const std::string tok = (dir / "tokenizer.json").string();
    const std::string pre = arch == "qwen2" || arch == "qwen3" || arch == "qwen3moe" ? "qwen2"
                            : arch == "gpt2"    ? "gpt-2"
                            : arch == "llama"   ? "llama-bpe"
                            : arch == "gpt-oss" ? "gpt-4o"
                                                : "default";
    // The vocabulary is padded to vocab_size, which must be the embedding's
    // row count: more would name tokens no weight has (and a huge one would
    // exhaust memory before anything is written).
    const auto embd = std::find_if(plan.begin(), plan.end(), [](const Planned& p) { return p.gguf == "token_embd.weight"; });
    if (embd == plan.end() || embd->dims.size() != 2)
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': no 2-D token embedding tensor", o.hf_dir));
    if (embd->dims[1] != hp.n_vocab)
        throw Error(Code::ModelLoadFailed, fmt::format("'{}': vocab_size {} is not the row count {} of '{}'", cfg_file,
                                                       hp.n_vocab, embd->dims[1], embd->hf));
    std::vector<std::pair<std::string, GgufValue>> extra;
    for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
        if (cfg.contains(k) && cfg[k].is_number_unsigned() && cfg[k].get<uint64_t>() < hp.n_vocab) {
            std::string gk = std::string("tokenizer.ggml.") + (std::string(k) == "pad_token_id" ? "padding_token_id" : k);
            extra.emplace_back(gk, GgufValue::u32(cfg[k].get<uint32_t>()));
        }
    }
    Vocab vocab = load_vocab(tok, hp.n_vocab, pre, extra);
    for (const auto& [k, v] : vocab.kv) w.set(k, v);
    w.set("general.quantization_version", GgufValue::u32(2));

    ModelFacts facts{hp.n_layer, false};
    for (const auto& p : plan) if (p.gguf == "output.weight") facts.has_output = true;

    WorkerPool pool(o.threads);
    ConvertResult r;
    r.architecture = arch;
    if (!hp.rope_freqs.empty()) {  // first, where llama.cpp's converter puts it
        w.add_tensor("rope_freqs.weight", EH_TYPE_F32, {hp.rope_freqs.size()}, hp.rope_freqs.data());
        ++r.census["F32"];
    }
    for (const auto& p : plan) {
        uint32_t type = EH_TYPE_MXFP4;
        if (p.op != Op::Mxfp4) {
            const bool q = is_quantizable(p.gguf, p.dims);
            type = q ? choose_type(o.target, facts, p.gguf, p.dims, EH_TYPE_F16) : uint32_t(EH_TYPE_F32);
        }
        const char* tn = eh_tensor_type_traits(type).name;
        ++r.census[tn ? tn : "?"];
        w.add_tensor(p.gguf, type, p.dims, [&pool, &st, p, type, &o](model::ByteSink& sink) {
            if (o.log) o.log(fmt::format("{} <- {}", p.gguf, p.hf));
            write_planned(p, st, type, pool, sink);
        });
    }
    w.write(o.out);
    r.n_tensors = plan.size() + (hp.rope_freqs.empty() ? 0 : 1);
    r.out_bytes = fs::file_size(o.out);
    return r;
}

}  // namespace eh::tools
