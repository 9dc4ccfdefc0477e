// Where a served model runs (ABI 1.6 device sets): the GPUs of its load
// from --tensor-parallel / --gpus / --gpu-device, checked against the
// plugin's max_devices and against the GPUs' free memory before the load,
// and the list /health, the ready line and /metrics show.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

#include "eh/model/model_file.hpp"
#include "eh/registry.hpp"
#include "gpu_set.hpp"

namespace eh::cli {

struct PlacementAsk {
    uint32_t tensor_parallel = 1;
    std::vector<int> gpus;  // --gpus; empty: chosen
    int gpu_device = 0;     // --gpu-device (one rank, no --gpus)
    uint32_t ctx_size = 0;  // --ctx-size, for the KV share of the fit check
    uint64_t kv_cache_mb = 0;
    uint32_t kv_type = 0;
};

struct Placement {
    std::vector<int> devices;    // rank order; empty for a CPU plugin
    std::vector<GpuFacts> gpus;  // what the plugin's probe saw
    // [{rank, gpu, name, total_bytes, free_bytes_at_start}], or for a CPU
    // plugin [{rank 0, "cpu"}].
    nlohmann::json json;
};

// Throws Error: INVALID_REQUEST when the plugin spans fewer devices than
// asked (naming it), NO_PLUGIN for a GPU of --gpus the plugin cannot use
// (with its probe's reason), INSUFFICIENT_VRAM for too few GPUs or a fit
// shortfall (fit_shortfall's message).
Placement place_model(const PluginRecord& plugin, const model::ModelFile& file, const PlacementAsk& ask);

}  // namespace eh::cli
