// Hugging Face tensor names -> GGUF tensor names. Only names change: data,
// shapes and layouts stay as the checkpoint stores them (a GGUF converter
// would also permute llama Q/K rows, transpose GPT-2 Conv1D weights and
// split gpt-oss gate_up experts; plugins see general.source_format and do
// what they need).
#include <cctype>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "eh/model/hf_names.hpp"
#include "hf.hpp"

namespace eh::model::detail {

namespace {

struct Rule {
    std::string_view hf;    // per-layer module path, before ".weight"/".bias"
    std::string_view gguf;  // GGUF per-layer name
};

// Decoder layers of llama (and mistral), qwen2, qwen3, qwen3moe, phi3 and gpt-oss ("model.layers.N.<hf>.<suffix>").
constexpr Rule kLayerRules[] = {
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.qkv_proj", "attn_qkv"},
    {"self_attn.q_norm", "attn_q_norm"},  // qwen3: per-head RMSNorm before RoPE
    {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"mlp.gate_up_proj", "ffn_up"},  // phi3: fused gate+up, as GGUF phi3 stores it
    {"mlp.router", "ffn_gate_inp"},
};

// Gemma 3's four norms a layer: around attention and around the MLP.
constexpr Rule kGemma3NormRules[] = {
    {"post_attention_layernorm", "post_attention_norm"},
    {"pre_feedforward_layernorm", "ffn_norm"},
    {"post_feedforward_layernorm", "post_ffw_norm"},
};

// GPT-2 blocks ("h.N.<hf>.<suffix>").
constexpr Rule kGpt2Rules[] = {
    {"ln_1", "attn_norm"},
    {"ln_2", "ffn_norm"},
    {"attn.c_attn", "attn_qkv"},
    {"attn.c_proj", "attn_output"},
    {"mlp.c_fc", "ffn_up"},
    {"mlp.c_proj", "ffn_down"},
};

// gpt-oss experts store MXFP4 as separate blocks/scales tensors plus a bias,
// with names that end in "_blocks", "_scales", "_bias" instead of ".weight".
constexpr Rule kGptOssExpertRules[] = {
    {"mlp.experts.gate_up_proj_blocks", "ffn_gate_up_exps.blocks"},
    {"mlp.experts.gate_up_proj_scales", "ffn_gate_up_exps.scales"},
    {"mlp.experts.gate_up_proj_bias", "ffn_gate_up_exps.bias"},
    {"mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"},
    {"mlp.experts.down_proj_blocks", "ffn_down_exps.blocks"},
    {"mlp.experts.down_proj_scales", "ffn_down_exps.scales"},
    {"mlp.experts.down_proj_bias", "ffn_down_exps.bias"},
    {"mlp.experts.down_proj", "ffn_down_exps.weight"},
    {"self_attn.sinks", "attn_sinks.weight"},
};

// Qwen3-MoE's sparse block ("model.layers.N.mlp.<rest>"): the router, and
// the experts either one module each (the checkpoints transformers 4 wrote,
// and what transformers 5 saves by default) or fused 3D tensors (its
// `save_original_format=False` and models released in that form). Per-expert
// names follow the GGUF names llama.cpp gave split experts
// ("blk.N.ffn_gate.E.weight"); the fused tensors keep HF's layout, which is
// the converter's: gate_up_proj [E, 2F, H] (gate rows first), down_proj
// [E, H, F].
std::optional<std::string> qwen3moe_mlp(std::string_view s) {
    if (s == "gate.weight") return std::string("ffn_gate_inp.weight");
    if (s == "experts.gate_up_proj") return std::string("ffn_gate_up_exps.weight");
    if (s == "experts.down_proj") return std::string("ffn_down_exps.weight");
    std::string_view rest = s;
    if (rest.substr(0, 8) != "experts.") return std::nullopt;
    rest.remove_prefix(8);
    size_t i = 0;
    while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) ++i;
    // a decimal expert number without leading zeros ("07" is not expert 7)
    if (i == 0 || i > 6 || (i > 1 && rest[0] == '0') || i >= rest.size() || rest[i] != '.') return std::nullopt;
    const std::string_view expert = rest.substr(0, i), proj = rest.substr(i + 1);
    for (std::string_view which : {"gate", "up", "down"})
        if (proj.size() == which.size() + 12 && proj.substr(0, which.size()) == which &&
            proj.substr(which.size()) == "_proj.weight")
            return fmt::format("ffn_{}.{}.weight", which, expert);
    return std::nullopt;
}

bool consume_prefix(std::string_view& s, std::string_view p) {
    if (s.substr(0, p.size()) != p) return false;
    s.remove_prefix(p.size());
    return true;
}

// "<module>.weight" / "<module>.bias" against a rule table.
std::optional<std::string> by_rules(std::string_view rest, const Rule* begin, const Rule* end) {
    for (const Rule* r = begin; r != end; ++r) {
        std::string_view s = rest;
        if (!consume_prefix(s, r->hf)) continue;
        if (s == ".weight" || s == ".bias") return fmt::format("{}{}", r->gguf, s);
    }
    return std::nullopt;
}

std::optional<std::string> exact(std::string_view rest, const Rule* begin, const Rule* end) {
    for (const Rule* r = begin; r != end; ++r)
        if (rest == r->hf) return std::string(r->gguf);
    return std::nullopt;
}

// Splits "<N>.<rest>" into the layer number and the rest.
bool layer_number(std::string_view& s, std::string& n) {
    size_t i = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == 0 || i >= s.size() || s[i] != '.') return false;
    n = std::string(s.substr(0, i));
    s.remove_prefix(i + 1);
    return true;
}

}  // namespace

std::string hf_tensor_name(std::string_view arch, std::string_view hf_name) {
    std::string_view s = hf_name;
    // Gemma3ForConditionalGeneration keeps its decoder under
    // language_model.model. (transformers 4) or model.language_model.
    // (later); its vision tower's tensors keep their hf.* names.
    if ((arch == "gemma3" || arch == "qwen2vl") &&
        (consume_prefix(s, "language_model.") || consume_prefix(s, "model.language_model."))) {
        if (s == "lm_head.weight") return "output.weight";
        consume_prefix(s, "model.");
    } else {
        if (s == "lm_head.weight") return "output.weight";
        if (s == "lm_head.bias") return "output.bias";
        if (!consume_prefix(s, "model.")) consume_prefix(s, "transformer.");
    }
    std::string n;
    if (arch == "gpt2") {
        if (consume_prefix(s, "wte.")) return fmt::format("token_embd.{}", s);
        if (consume_prefix(s, "wpe.")) return fmt::format("position_embd.{}", s);
        if (consume_prefix(s, "ln_f.")) return fmt::format("output_norm.{}", s);
        if (consume_prefix(s, "h.") && layer_number(s, n))
            if (auto g = by_rules(s, std::begin(kGpt2Rules), std::end(kGpt2Rules)))
                return fmt::format("blk.{}.{}", n, *g);
        return fmt::format("hf.{}", hf_name);
    }
    if (consume_prefix(s, "embed_tokens.")) return fmt::format("token_embd.{}", s);
    if (consume_prefix(s, "norm.")) return fmt::format("output_norm.{}", s);
    if (consume_prefix(s, "layers.") && layer_number(s, n)) {
        if (arch == "gpt-oss") {
            if (auto g = exact(s, std::begin(kGptOssExpertRules), std::end(kGptOssExpertRules)))
                return fmt::format("blk.{}.{}", n, *g);
            // gpt-oss has a norm after attention where the others have ffn_norm.
            std::string_view p = s;
            if (consume_prefix(p, "post_attention_layernorm") && (p == ".weight" || p == ".bias"))
                return fmt::format("blk.{}.post_attention_norm{}", n, p);
        }
        if (arch == "gemma3")
            if (auto g = by_rules(s, std::begin(kGemma3NormRules), std::end(kGemma3NormRules)))
                return fmt::format("blk.{}.{}", n, *g);
        if (arch == "qwen3moe") {
            std::string_view p = s;
            if (consume_prefix(p, "mlp."))
                if (auto g = qwen3moe_mlp(p)) return fmt::format("blk.{}.{}", n, *g);
        }
        if (auto g = by_rules(s, std::begin(kLayerRules), std::end(kLayerRules)))
            return fmt::format("blk.{}.{}", n, *g);
    }
    return fmt::format("hf.{}", hf_name);
}

}  // namespace eh::model::detail

namespace eh::model {

std::string hf_model_type_to_arch(std::string_view model_type) { return detail::hf_architecture(model_type); }

std::string hf_tensor_name_to_gguf(std::string_view arch, std::string_view hf_name) {
    return detail::hf_tensor_name(arch, hf_name);
}

}  // namespace eh::model
