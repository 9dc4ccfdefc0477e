// place_model (serve_placement.hpp).
#include "serve_placement.hpp"

#include <fmt/format.h>

#include <algorithm>

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

std::string probe_reason(const eh_plugin_api& api, int d) {
    eh_probe_result pr{};
    pr.struct_size = sizeof pr;
    const eh_status st = api.probe(d, &pr);
    pr.reason[sizeof pr.reason - 1] = '\0';
    if (st != EH_OK) return std::string("probe failed with ") + eh_status_name(st);
    return pr.reason[0] ? pr.reason : "its probe refuses it";
}

}  // namespace

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
    if (!plugin.api) {
        p.devices = {ask.gpu_device};
        p.json = nlohmann::json::array({{{"rank", 0}, {"gpu", ask.gpu_device}}});
        return p;
    }
    p.gpus = probe_gpus(*plugin.api);
    if (!ask.gpus.empty()) {
        for (int d : ask.gpus)
            if (d >= int(p.gpus.size()))
                throw Error(Code::NoPlugin, fmt::format("--gpus names GPU {}, which plugin {} cannot use: {}", d, name,
                                                        probe_reason(*plugin.api, d)));
        p.devices = ask.gpus;
    } else if (ask.tensor_parallel > 1) {
        p.devices = pick_gpus(p.gpus, ask.tensor_parallel);
    } else {
        p.devices = {ask.gpu_device};
    }
    FitNeed need;
    for (const eh_tensor& t : file.tensors()) need.weight_bytes += t.nbytes;
    kv_need(file, ask, need);
    if (std::string why = fit_shortfall(need, p.devices, p.gpus); !why.empty()) throw Error(Code::InsufficientVram, why);
    p.json = nlohmann::json::array();
    for (size_t r = 0; r < p.devices.size(); ++r) {
        const int d = p.devices[r];
        nlohmann::json j = {{"rank", r}, {"gpu", d}};
        if (d < int(p.gpus.size())) {
            j["name"] = p.gpus[size_t(d)].name;
            j["total_bytes"] = p.gpus[size_t(d)].total_bytes;
            j["free_bytes_at_start"] = p.gpus[size_t(d)].free_bytes;
        }
        p.json.push_back(j);
    }
    return p;
}

}  // namespace eh::cli
