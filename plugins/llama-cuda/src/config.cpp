#include "config.hpp"

#include <algorithm>
#include <cmath>

#include <engine_host/gemma3.hpp>
#include <engine_host/model_source.hpp>
#include <engine_host/rope_scaling.hpp>
#include <ehcuda/arch_metadata.hpp>
#include <ehcuda/kernels.hpp>

namespace llama_cuda {
Config read_config(const ehp::ModelView& view) {
    Config c;
    c.arch = std::string(view.architecture());
    if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "phi3" && c.arch != "gemma3" &&
        c.arch != "qwen2vl")
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda does not serve architecture '" + c.arch +
                                             "' (llama, qwen2, qwen3, phi3, gemma3, qwen2vl)");
    c.gemma = c.arch == "gemma3";
    if (c.gemma)
        if (const std::string why = ehp::gemma3::unsupported(view); !why.empty())
            throw ehp::Error(EH_UNSUPPORTED, "gemma3: " + why + " by llama-cuda");
    c.qk_norm = c.arch == "qwen3" || c.gemma;
    auto req = [&](const char* suffix) { return ehcuda::arch_int(view, suffix); };
    auto opt = [&](const char* suffix, int dflt) { return ehcuda::arch_int_or(view, suffix, dflt); };
    c.n_embd = req("embedding_length");
    c.n_layer = req("block_count");
    c.n_head = req("attention.head_count");
    c.n_kv = opt("attention.head_count_kv", c.n_head);
    c.n_ff = req("feed_forward_length");
    c.n_ctx_train = opt("context_length", 4096);
    c.head_dim = opt("attention.key_length", c.n_embd / c.n_head);
    c.n_rot = opt("rope.dimension_count", c.head_dim);
    if (auto e = view.get_float(view.arch_key("attention.layer_norm_rms_epsilon"))) c.eps = float(*e);
    if (auto f = view.get_float(view.arch_key("rope.freq_base"))) c.freq_base = float(*f);
    // Llama 3.x scaling arrives as per-pair divisors (model.cpp binds them);
    // the other schemes would silently rotate wrong, so they are refused.
    std::string scaling = ehp::rope_scaling_type(view);
    if (c.gemma) {
        // Gemma 3's global layers: linear scaling (x8 on the 4B and larger),
        // as cpu-reference reads it (the legacy rope.scale_linear key too).
        const double factor = ehp::rope_param(view, "rope.scaling.factor", "factor").value_or(1.0);
        if (auto legacy = view.get_float(view.arch_key("rope.scale_linear")); legacy && scaling == "none") {
            scaling = "linear";
            c.rope_linear = float(*legacy);
        } else if (scaling == "linear") {
            c.rope_linear = float(factor);
        }
        if (!(c.rope_linear > 0.0f) || !std::isfinite(c.rope_linear))
            throw ehp::Error(EH_MODEL_LOAD_FAILED, "gemma3: the linear rope scaling factor must be positive");
        if (scaling != "none" && scaling != "linear")
            throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: gemma3 rope scaling '" + scaling + "' is not supported (none, linear)");
    } else if (scaling != "none" && scaling != "llama3") {
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: rope scaling '" + scaling + "' is not supported (none, llama3)");
    }
    if (view.find_tensor("rope_factors_long.weight") || view.find_tensor("rope_factors_short.weight"))
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: LongRoPE (rope_factors_long/short, e.g. Phi-3 128k) is not supported");
    if (auto w = view.get_uint(view.arch_key("attention.sliding_window"))) c.window = int(std::min<uint64_t>(*w, 1u << 30));
    if (c.gemma) {
        c.sliding = ehp::gemma3::sliding_layers(view, uint32_t(c.n_layer));
        c.local_freq_base = float(ehp::gemma3::local_rope_base(view));
        if (!(c.local_freq_base > 1.0f))
            throw ehp::Error(EH_MODEL_LOAD_FAILED, view.arch_key("rope.freq_base_swa") + " must be > 1");
        c.attn_scale = ehp::gemma3::attention_scale(view, uint32_t(c.n_layer), uint32_t(c.n_embd), uint32_t(c.n_head),
                                                    uint32_t(c.head_dim));
        c.logit_softcap = ehp::gemma3::final_logit_softcap(view);
        c.embd_scale = std::sqrt(float(c.n_embd));
    }
    // GGUF llama files carry Q/K rows permuted by the converter for the
    // interleaved rotation; a Hugging Face checkpoint served as is (the
    // host's safetensors view, or a file marked general.source_format =
    // safetensors) keeps HF's order, whose rotate_half is the NEOX pairing.
    c.neox = c.arch != "llama" || ehp::from_safetensors(view);

    auto bad = [&](const std::string& why) { throw ehp::Error(EH_MODEL_LOAD_FAILED, c.arch + ": " + why); };
    if (c.n_head % c.n_kv) bad("head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " + std::to_string(c.n_kv));
    // Head dims 64/96/128/256 take the tiled attention kernels, others up to
    // the limit a generic one; widths that are not a multiple of 32 take the
    // generic matmul (each weight row must still be whole blocks of its
    // type, checked per tensor at load).
    if (!ehcuda::attention_head_dim_supported(c.head_dim))
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: head dimension " + std::to_string(c.head_dim) +
                                             " not supported (attention kernels take 1.." +
                                             std::to_string(ehcuda::kAttentionMaxHeadDim) + ")");
    if (c.n_rot > c.head_dim || c.n_rot % 2) bad("rope.dimension_count " + std::to_string(c.n_rot) + " invalid");
    if (!(c.eps > 0.0f) || !(c.freq_base > 0.0f)) bad("rms epsilon and rope.freq_base must be positive");
    // (the rotation's NEOX pairing is what M-RoPE's sections split; its
    // image positions are shifted onto the plain rotation, which takes no
    // per-pair divisors then: batch_mrope.cpp)
    c.mrope = ehp::mrope::read_sections(view, uint32_t(c.n_rot));
    if (c.mrope.active() && (scaling != "none" || view.find_tensor("rope_freqs.weight")))
        throw ehp::Error(EH_UNSUPPORTED, "llama-cuda: qwen2vl with rope scaling or rope_freqs is not supported");
    return c;
}

float Config::scale() const { return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(float(head_dim)); }

}  // namespace llama_cuda
