// Gemma 3's attention settings, read the same way by every plugin that
// serves `gemma3`, from a GGUF as llama.cpp's converter writes it or from a
// Hugging Face directory behind the host's translation.
//
// - Layers alternate local and global attention: with a pattern period P,
//   layer i slides when i % P < P - 1 (five of six for Gemma 3's P = 6). The
//   converter writes only `gemma3.attention.sliding_window` (no window, no
//   sliding at all); the period defaults to 6 and may be given as
//   `gemma3.attention.sliding_window_pattern` (or, as gguf-py can write that
//   key, one bool a layer). A newer HF config lists the layers instead
//   (`layer_types`, which the host passes as hf.layer_types).
// - Sliding layers rotate with their own base (`rope.freq_base_swa`, 10000
//   by default) and no scaling; global layers use `rope.freq_base` and any
//   `rope.scaling.*` (linear x8 on the 4B and larger).
// - The attention scale is query_pre_attn_scalar^-1/2. The converter does not
//   store it; llama.cpp derives it from the layer count (the 62-layer 27B
//   uses hidden / heads = 168, the others the head size). An HF directory
//   gives it: the host writes it as `gemma3.attention.scale`.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

namespace ehp::gemma3 {

inline constexpr uint32_t kDefaultPattern = 6;
inline constexpr double kDefaultLocalBase = 10000.0;

// Which layers slide; all false when the model has no window. Throws
// ehp::Error(EH_MODEL_LOAD_FAILED) for a malformed pattern or layer list.
inline std::vector<bool> sliding_layers(const ModelView& v, uint32_t n_layer) {
    std::vector<bool> out(n_layer, false);
    const auto window = v.get_uint(v.arch_key("attention.sliding_window"));
    if (!window || *window == 0) return out;
    if (const eh_value* types = v.find("hf.layer_types")) {
        if (types->type != EH_VALUE_ARRAY || types->elem_type != EH_VALUE_STRING || types->count != n_layer)
            throw Error(EH_MODEL_LOAD_FAILED, "hf.layer_types must list one string per layer (" +
                                                  std::to_string(n_layer) + ")");
        const auto* s = static_cast<const eh_string*>(types->v.array);
        for (uint32_t i = 0; i < n_layer; ++i) {
            const std::string_view t = to_sv(s[i]);
            if (t == "sliding_attention") out[i] = true;
            else if (t != "full_attention")
                throw Error(EH_MODEL_LOAD_FAILED, "hf.layer_types[" + std::to_string(i) + "] is '" + std::string(t) +
                                                      "' (sliding_attention or full_attention)");
        }
        return out;
    }
    const std::string key = v.arch_key("attention.sliding_window_pattern");
    uint64_t period = kDefaultPattern;
    if (const eh_value* per_layer = v.find(key); per_layer && per_layer->type == EH_VALUE_ARRAY) {
        // gguf-py's per-layer form (one bool a layer), as other converters write it
        if (per_layer->elem_type != EH_VALUE_BOOL || per_layer->count != n_layer)
            throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' as an array must hold one bool per layer (" +
                                                  std::to_string(n_layer) + ")");
        const auto* b = static_cast<const uint8_t*>(per_layer->v.array);
        for (uint32_t i = 0; i < n_layer; ++i) out[i] = b[i] != 0;
        return out;
    }
    if (v.find(key)) {
        const auto p = v.get_uint(key);
        if (!p || *p > 4096) throw Error(EH_MODEL_LOAD_FAILED, "'" + key + "' must be an integer in 0..4096");
        period = *p;
    }
    // period 0 or 1: every layer slides (llama.cpp's set_swa_pattern reads 0 so)
    for (uint32_t i = 0; i < n_layer; ++i) out[i] = period <= 1 || i % period < period - 1;
    return out;
}

// The RoPE base of the sliding layers.
inline double local_rope_base(const ModelView& v) {
    return v.get_float(v.arch_key("rope.freq_base_swa")).value_or(kDefaultLocalBase);
}

// The factor q is multiplied by before q.k.
inline float attention_scale(const ModelView& v, uint32_t n_layer, uint32_t n_embd, uint32_t n_head,
                             uint32_t head_dim) {
    if (auto s = v.get_float(v.arch_key("attention.scale"))) {
        if (!(*s > 0.0) || !std::isfinite(*s))
            throw Error(EH_MODEL_LOAD_FAILED, "'" + v.arch_key("attention.scale") + "' must be a positive number");
        return static_cast<float>(*s);
    }
    const uint32_t d = n_layer == 62 ? n_embd / n_head : head_dim;
    return 1.0f / std::sqrt(static_cast<float>(d));
}

// tanh soft-capping of the final logits (cap * tanh(x / cap)); 0 = none.
inline float final_logit_softcap(const ModelView& v) {
    const double c = v.get_float(v.arch_key("final_logit_softcapping")).value_or(0.0);
    if (c < 0.0 || !std::isfinite(c))
        throw Error(EH_MODEL_LOAD_FAILED, "'" + v.arch_key("final_logit_softcapping") + "' must be >= 0");
    return static_cast<float>(c);
}

// Why an HF Gemma 3 config cannot be served as llama.cpp serves gemma3, or
// "" when it can (a GGUF always can: the converter writes only that form).
inline std::string unsupported(const ModelView& v) {
    if (v.find("hf.attn_logit_softcapping"))
        return "attn_logit_softcapping (Gemma 2's attention soft-cap) is not supported";
    if (auto bidi = v.get_uint("hf.use_bidirectional_attention"); bidi && *bidi != 0)
        return "use_bidirectional_attention (EmbeddingGemma's encoder attention) is not supported";
    if (auto act = v.get_string("hf.hidden_activation"); act && *act != "gelu_pytorch_tanh")
        return "hidden_activation '" + std::string(*act) + "' is not supported (gelu_pytorch_tanh)";
    return {};
}

}  // namespace ehp::gemma3
