#include "device_choice.hpp"

#include "eh/error.hpp"

namespace eh::cli {

bool parse_device_policy(const std::string& text, DevicePolicy& out) {
    if (text == "auto") out = DevicePolicy::Auto;
    else if (text == "gpu") out = DevicePolicy::Device;
    else if (text == "cpu") out = DevicePolicy::Cpu;
    else if (text == "any") out = DevicePolicy::Any;
    else return false;
    return true;
}

std::string no_plugin_message(const Registry& reg, const ModelRequirements& need, const Resolution& res) {
    std::string msg = res.explanation;
    bool gpu_refused = false;
    for (const PluginRecord* r : res.rejected_claimants) gpu_refused |= r->caps.device_kind != "cpu";
    if (!gpu_refused) return msg;
    Resolution cpu = reg.resolve(need, DevicePolicy::Cpu);
    if (cpu.plugin)
        msg += "\n  the CPU engine does not stand in for a rejected GPU plugin unasked: pass --device cpu to serve "
               "this model with " + cpu.plugin->caps.name + " on the CPU";
    else
        msg += "\n  no CPU plugin serves this model either";
    return msg;
}

std::string named_gpu_problem(const Registry& reg, int gpu, DevicePolicy policy) {
    if (policy == DevicePolicy::Cpu) return "";
    std::string plugins;
    for (const PluginRecord& r : reg.records()) {
        if (r.caps.device_kind == "cpu") continue;
        if (r.accepted) return "";
        std::string why;
        for (const auto& s : r.reasons) why += (why.empty() ? "" : "; ") + s;
        plugins += "\n  " + (r.caps.name.empty() ? r.manifest_path : r.caps.name) + " (rejected): " + why;
    }
    const std::string n = std::to_string(gpu);
    std::string msg = "GPU " + n + " was asked for on the command line, and no GPU plugin can use it";
    msg += plugins.empty() ? " (no GPU plugin was found)" : ":" + plugins;
    msg += "\n  the CPU engine does not stand in for a named GPU: name a GPU that exists, or pass --device cpu to "
           "serve this model on the CPU";
    return msg;
}

const PluginRecord& choose_plugin(const Registry& reg, const ModelRequirements& need, DevicePolicy policy,
                                  std::optional<int> named_gpu) {
    if (named_gpu) {
        std::string problem = named_gpu_problem(reg, *named_gpu, policy);
        if (!problem.empty()) throw Error(Code::NoPlugin, problem);
    }
    Resolution res = reg.resolve(need, policy);
    if (!res.plugin) throw Error(Code::NoPlugin, no_plugin_message(reg, need, res));
    return *res.plugin;
}

}  // namespace eh::cli
