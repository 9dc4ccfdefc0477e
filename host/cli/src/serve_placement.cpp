// place_model (serve_placement.hpp).
#include "serve_placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "eh/error.hpp"
#include "eh/loader/engine.hpp"
#include "eh/model/descriptor.hpp"
#include "serve_model.hpp"

namespace eh::cli {
namespace {

// The KV cache the fit check counts: --kv-cache-size-mb, else one sequence
// of --ctx-size (or of the trained context, at most 4096 tokens: the pool
// grows into what the weights leave, and a shorter context is granted when
// less is left).
void kv_need(const model::ModelFile& file, const PlacementAsk& ask, FitNeed& need) {
    if (ask.kv_cache_mb) {
        need.kv_bytes = ask.kv_cache_mb << 20;
        need.kv_what = fmt::format("--kv-cache-size-mb {}", ask.kv_cache_mb);
        return;
    }
    const auto per = kv_bytes_per_token(file, eh_model_info{}, ask.kv_type);
    if (!per) {
        need.kv_what = "not stated by the model";
        return;
    }
    const uint32_t trained = model::describe(file).context_length;
    const uint64_t tokens = ask.ctx_size ? ask.ctx_size : std::min<uint64_t>(trained ? trained : 4096, 4096);
    need.kv_bytes = *per * tokens;
    need.kv_what = fmt::format("one sequence of {} tokens", tokens);
}

}  // namespace

static nlohmann::json gpu_json(size_t rank, int d, const GpuFacts* g) {
    nlohmann::json j = {{"rank", rank}, {"gpu", d}};
    if (g && g->usable) {
        j["name"] = g->name;
        j["total_bytes"] = g->total_bytes;
        j["free_bytes_at_start"] = g->free_bytes;
    }
    return j;
}

Placement place_model(const PluginRecord& plugin, const model::ModelFile& file, const PlacementAsk& ask) {
    Placement p;
    const std::string& name = plugin.caps.name;
    // (--engine-process: the plugin is not open in this process, so nothing
    // is probed here; the settings keep that mode to one rank)
    const uint32_t most = plugin.api ? plugin_max_devices(*plugin.api) : 1;
    if (ask.tensor_parallel > most)
        throw Error(Code::InvalidRequest,
                    fmt::format("plugin {} serves {}; --tensor-parallel {} needs a plugin that spans {} devices", name,
                                most == 1 ? std::string("one device only") : fmt::format("at most {} devices", most),
                                ask.tensor_parallel, ask.tensor_parallel));
    if (plugin.caps.device_kind == "cpu") {
        p.json = nlohmann::json::array({{{"rank", 0}, {"device", "cpu"}}});
        return p;
    }
    if (!plugin.api || (ask.tensor_parallel == 1 && ask.gpus.empty())) {
        // One rank on --gpu-device: what discovery's probe saw (no other GPU
        // is touched); the plugin checks its own memory.
        p.devices = {ask.gpu_device};
        GpuFacts g;
        if (plugin.probe && plugin.probe->supported) {
            g.usable = true;
            g.name = plugin.probe->device_name;
            g.total_bytes = plugin.probe->total_memory_bytes;
            g.free_bytes = plugin.probe->free_memory_bytes;
        }
        p.json = nlohmann::json::array({gpu_json(0, ask.gpu_device, plugin.probe ? &g : nullptr)});
        return p;
    }
    if (!ask.gpus.empty()) {
        std::vector<int> named = ask.gpus;
        std::sort(named.begin(), named.end());
        named.erase(std::unique(named.begin(), named.end()), named.end());
        p.gpus = probe_gpus(*plugin.api, named);
        for (const GpuFacts& g : p.gpus)
            if (!g.usable)
                throw Error(Code::NoPlugin,
                            fmt::format("--gpus names GPU {}, which plugin {} cannot use: {}", g.ordinal, name, g.reason));
        p.devices = ask.gpus;
    } else {
        p.gpus = probe_gpus(*plugin.api, all_ordinals());
        p.devices = pick_gpus(p.gpus, ask.tensor_parallel);
    }
    if (p.devices.size() > 1) {
        FitNeed need;
        for (const eh_tensor& t : file.tensors()) {
            // the plugins' split, near enough for a fit check: the layers'
            // matrices are cut (gpt-cuda's router and the one extra expert a
            // rank may hold are small beside them), the rest is on every rank
            // whole
            const bool layer_matrix = t.n_dims >= 2 && std::string_view(t.name.data, t.name.size).starts_with("blk.");
            (layer_matrix ? need.sharded_bytes : need.replicated_bytes) += t.nbytes;
        }
        kv_need(file, ask, need);
        if (std::string why = fit_shortfall(need, p.devices, p.gpus); !why.empty())
            throw Error(Code::InsufficientVram, why);
    }
    p.json = nlohmann::json::array();
    for (size_t r = 0; r < p.devices.size(); ++r) p.json.push_back(gpu_json(r, p.devices[r], find_gpu(p.gpus, p.devices[r])));
    return p;
}

}  // namespace eh::cli
