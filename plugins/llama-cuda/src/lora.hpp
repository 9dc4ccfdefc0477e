// LoRA adapters (ABI 1.6) on llama-cuda: which of the model's matrices an
// adapter's pairs bind to (the "sites" of ehcuda::LoraSet); the upload and
// the step's updates are cuda-common's (ehcuda/lora.hpp). Not with tensor
// parallelism (adapter_load refuses it by name).
#pragma once

#include <memory>

#include <ehcuda/lora.hpp>

#include <engine_host/plugin_abi.h>

#include "model.hpp"

namespace llama_cuda {

// A layer's sites, in the order of its matmuls. kLoraQ is the fused
// attn_qkv where the model has one, kLoraGate the fused ffn_up (gate|up) of
// phi3.
enum LoraKind { kLoraQ = 0, kLoraK, kLoraV, kLoraOut, kLoraGate, kLoraUp, kLoraDown, kLoraPerLayer };
inline int lora_site(int layer, int kind) { return layer * kLoraPerLayer + kind; }
inline int lora_head_site(const Config& c) { return c.n_layer * kLoraPerLayer; }

// adapter_load: checks the view against the model (ehp::read_lora_adapter),
// binds every pair to its site and uploads it (a llama served from a
// Hugging Face directory gets its q/k pairs' B rows put back in that
// order). Throws ehp::Error.
std::unique_ptr<ehcuda::LoraAdapter> load_adapter(Model& m, const eh_adapter_params& p);

}  // namespace llama_cuda
