// LoRA adapters (ABI 1.6) on gpt-cuda: the sites an adapter's pairs bind to
// (ehcuda::LoraSet; the upload and the step's updates are cuda-common's,
// ehcuda/lora.hpp): a layer's q / k / v (or GPT-2's fused attn_qkv) and
// attn_output, GPT-2's MLP (ffn_up, ffn_down), and the LM head. The routers
// and experts of gpt-oss / Qwen3-MoE are not adapted (adapter_load refuses
// a pair for a router by name; the file reader refuses 3-D expert pairs).
#pragma once

#include <memory>

#include <ehcuda/lora.hpp>

#include <engine_host/plugin_abi.h>

#include "model.hpp"

namespace gpt_cuda {

enum LoraKind { kLoraQ = 0, kLoraK, kLoraV, kLoraOut, kLoraUp, kLoraDown, kLoraPerLayer };
inline int lora_site(int layer, int kind) { return layer * kLoraPerLayer + kind; }
inline int lora_head_site(const Config& c) { return c.n_layer * kLoraPerLayer; }

// adapter_load: checks the view against the model, binds and uploads every
// pair. Throws ehp::Error.
std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p);

}  // namespace gpt_cuda
