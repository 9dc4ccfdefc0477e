// Where a model view's tensors came from, for plugins that read them
// differently by source. C++ only, header-only, like plugin_abi.hpp.
#pragma once

#include "engine_host/plugin_abi.hpp"

namespace ehp {

// A Hugging Face checkpoint: the host's safetensors view, or a GGUF the host
// wrote from one (general.source_format = "safetensors"). Its tensors keep
// HF's row order (llama's Q/K rows not permuted for the interleaved rotation)
// and, for Qwen3-MoE, per-expert tensors no GGUF name covers.
inline bool from_safetensors(const ModelView& view) {
    if (view.raw().format == EH_FORMAT_SAFETENSORS) return true;
    const auto src = view.get_string("general.source_format");
    return src && *src == "safetensors";
}

}  // namespace ehp
