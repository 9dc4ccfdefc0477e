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

const PluginRecord& choose_plugin(const Registry& reg, const ModelRequirements& need, DevicePolicy policy) {
    Resolution res = reg.resolve(need, policy);
    if (!res.plugin) throw Error(Code::NoPlugin, no_plugin_message(reg, need, res));
    return *res.plugin;
}

}  // namespace eh::cli
