// The devices a load spans (ABI 1.6 eh_load_params.n_devices / devices),
// checked: host code only.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <engine_host/plugin_abi.hpp>

namespace ehcuda {

// One ordinal per rank: `device` alone for a host before 1.6 or
// n_devices 0; otherwise a copy of the array. INVALID_ARGUMENT for a NULL
// array, a negative ordinal, devices[0] != device, or more than
// max_devices (the plugin info's: 0 or 1 = one).
inline std::vector<int> load_devices(const eh_load_params& p, uint32_t max_devices) {
    if (p.struct_size < offsetof(eh_load_params, devices) + sizeof(p.devices) || p.n_devices == 0) return {p.device};
    const uint32_t most = max_devices ? max_devices : 1;
    if (p.n_devices > most)
        throw ehp::Error(EH_INVALID_ARGUMENT, "this plugin serves at most " + std::to_string(most) + " device" +
                                                  (most == 1 ? "" : "s") + " per model; the load names " +
                                                  std::to_string(p.n_devices));
    if (!p.devices) throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params.devices is NULL with n_devices > 0");
    std::vector<int> d(p.devices, p.devices + p.n_devices);
    for (int x : d)
        if (x < 0) throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params.devices holds " + std::to_string(x));
    if (d[0] != p.device)
        throw ehp::Error(EH_INVALID_ARGUMENT, "eh_load_params.devices[0] (" + std::to_string(d[0]) +
                                                  ") is not eh_load_params.device (" + std::to_string(p.device) + ")");
    return d;
}

// "0,0,1"
inline std::string device_list(const std::vector<int>& d) {
    std::string s;
    for (size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + std::to_string(d[i]);
    return s;
}

}  // namespace ehcuda
