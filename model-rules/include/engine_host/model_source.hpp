// Where a model view's tensors came from, for plugins that read them
// differently by source. C++ only, header-only, like plugin_abi.hpp.
#pragma once

#include <string>

#include <engine_host/plugin_abi.hpp>

namespace ehp {

// A Hugging Face checkpoint: the host's safetensors view, or a GGUF the host
// wrote from one (general.source_format = "safetensors"). Its tensors keep
// HF's row order (llama's Q/K rows not permuted for the interleaved rotation)
// and HF's expert layouts (gpt-oss: gate/up interleaved, [E, in, out];
// Qwen3-MoE: one tensor per expert, blk.N.ffn_gate.E.weight, or fused).
inline bool from_safetensors(const ModelView& view) {
    if (view.raw().format == EH_FORMAT_SAFETENSORS) return true;
    const auto src = view.get_string("general.source_format");
    return src && *src == "safetensors";
}

// Why a Qwen3-MoE model from an HF config cannot be served as llama.cpp
// serves qwen3moe (every layer sparse, the top-k weights renormalised), or
// "" when it can. Its GGUF keys carry none of these settings: the converter
// writes only models of that shape, so a GGUF file always passes.
inline std::string qwen3moe_unsupported(const ModelView& view) {
    if (auto norm = view.get_uint("hf.norm_topk_prob"); norm && *norm == 0)
        return "norm_topk_prob false (the routing weights not renormalised over the chosen experts) is not supported";
    if (auto step = view.get_uint("hf.decoder_sparse_step"); step && *step != 1)
        return "decoder_sparse_step " + std::to_string(*step) + " (dense layers between the sparse ones) is not supported";
    if (const eh_value* dense = view.find("hf.mlp_only_layers");
        dense && (dense->type != EH_VALUE_ARRAY || dense->count > 0))
        return "mlp_only_layers (dense layers in a sparse model) is not supported";
    return {};
}

}  // namespace ehp
