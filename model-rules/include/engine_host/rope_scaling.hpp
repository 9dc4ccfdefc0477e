// Llama 3 RoPE frequency scaling, shared by the plugins that serve `llama`.
//
// A Llama 3.x checkpoint says `"rope_type": "llama3"` with factor,
// low_freq_factor, high_freq_factor and original_max_position_embeddings.
// llama.cpp's converter turns that into a `rope_freqs.weight` tensor of
// n_rot/2 per-pair divisors (theta_i = pos * base^(-2i/n_rot) / f_i) and
// writes no scaling type; a Hugging Face directory has only the parameters.
// rope_freqs() gives the divisors either way, so both paths rotate alike.
#pragma once

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

namespace ehp {

struct Llama3Rope {
    double factor = 8.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    double original_context = 8192.0;
};

// Divisors of the n_rot/2 inverse frequencies: 1 for wavelengths shorter
// than original_context / high_freq_factor, `factor` for those longer than
// original_context / low_freq_factor, a smooth blend between (transformers'
// _compute_llama3_parameters, written as a divisor as the converter does).
inline std::vector<float> llama3_rope_factors(uint32_t n_rot, double freq_base, const Llama3Rope& p) {
    std::vector<float> out(n_rot / 2);
    const double low_wavelen = p.original_context / p.low_freq_factor;
    const double high_wavelen = p.original_context / p.high_freq_factor;
    for (uint32_t i = 0; i < n_rot / 2; ++i) {
        const double freq = 1.0 / std::pow(freq_base, 2.0 * i / n_rot);
        const double wavelen = 2.0 * 3.14159265358979323846 / freq;
        double f;
        if (wavelen < high_wavelen) {
            f = 1.0;
        } else if (wavelen > low_wavelen) {
            f = p.factor;
        } else {
            const double smooth = (p.original_context / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / p.factor + smooth);
        }
        out[i] = static_cast<float>(f);
    }
    return out;
}

// The rope scaling type the view declares: `{arch}.rope.scaling.type`, else
// (a Hugging Face directory) `hf.rope_parameters.rope_type` /
// `hf.rope_scaling.rope_type` / `.type`; "none" when there is none
// ("default" means none too).
inline std::string rope_scaling_type(const ModelView& v) {
    std::optional<std::string_view> s = v.get_string(v.arch_key("rope.scaling.type"));
    for (const char* k : {"hf.rope_parameters.rope_type", "hf.rope_scaling.rope_type", "hf.rope_scaling.type"})
        if (!s) s = v.get_string(k);
    if (!s || *s == "default" || s->empty()) return "none";
    return std::string(*s);
}

// A number from the GGUF key `{arch}.<gguf_suffix>` or else from the
// directory's `hf.rope_parameters.<hf_key>` / `hf.rope_scaling.<hf_key>`.
inline std::optional<double> rope_param(const ModelView& v, const char* gguf_suffix, const char* hf_key) {
    if (gguf_suffix)
        if (auto x = v.get_float(v.arch_key(gguf_suffix))) return x;
    for (const char* obj : {"hf.rope_parameters.", "hf.rope_scaling."})
        if (auto x = v.get_float(std::string(obj) + hf_key)) return x;
    return std::nullopt;
}

// Per-pair RoPE divisors of a llama-family view, or empty when it has none:
// the `rope_freqs.weight` tensor (F32, n_rot/2 values) if present, else
// computed from the "llama3" scaling parameters. Throws on a malformed
// tensor or parameters.
inline std::vector<float> rope_freqs(const ModelView& v, uint32_t n_rot, double freq_base) {
    if (const eh_tensor* t = v.find_tensor("rope_freqs.weight")) {
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims && d < EH_MAX_DIMS; ++d) n *= t->dims[d];
        if (t->type != EH_TYPE_F32 || n != n_rot / 2 || !t->data || t->nbytes < n * sizeof(float))
            throw Error(EH_MODEL_LOAD_FAILED, "tensor 'rope_freqs.weight' must be F32 with rope.dimension_count/2 = " +
                                                  std::to_string(n_rot / 2) + " values");
        std::vector<float> out(n);
        std::memcpy(out.data(), t->data, n * sizeof(float));
        for (float f : out)
            if (!(f > 0.0f) || !std::isfinite(f))
                throw Error(EH_MODEL_LOAD_FAILED, "tensor 'rope_freqs.weight' holds a value that is not a positive number");
        return out;
    }
    if (rope_scaling_type(v) != "llama3") return {};
    Llama3Rope p;
    p.factor = rope_param(v, "rope.scaling.factor", "factor").value_or(p.factor);
    p.low_freq_factor = rope_param(v, nullptr, "low_freq_factor").value_or(p.low_freq_factor);
    p.high_freq_factor = rope_param(v, nullptr, "high_freq_factor").value_or(p.high_freq_factor);
    p.original_context = rope_param(v, "rope.scaling.original_context_length", "original_max_position_embeddings")
                             .value_or(p.original_context);
    if (!(p.factor > 0.0) || !(p.low_freq_factor > 0.0) || !(p.high_freq_factor > p.low_freq_factor) ||
        !(p.original_context > 0.0))
        throw Error(EH_MODEL_LOAD_FAILED, "llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0 "
                                          "and original_max_position_embeddings > 0");
    return llama3_rope_factors(n_rot, freq_base, p);
}

}  // namespace ehp
