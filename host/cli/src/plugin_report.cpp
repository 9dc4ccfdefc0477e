#include "plugin_report.hpp"

#include <fmt/format.h>

namespace eh::cli {
namespace {

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
    return s;
}

}  // namespace

nlohmann::json record_json(const PluginRecord& r) {
    nlohmann::json j = {
        {"name", r.caps.name},
        {"version", r.caps.version},
        {"engine", r.caps.engine},
        {"accepted", r.accepted},
        {"reasons", r.reasons},
        {"library", r.library_path},
        {"manifest", r.manifest_path},
        {"formats", r.caps.formats},
        {"architectures", r.caps.architectures},
        {"quant_kinds", r.caps.quant_kinds},
        {"device", {{"kind", r.caps.device_kind}, {"min_compute_capability", r.caps.min_compute_capability}}},
        {"priority", r.caps.priority},
    };
    if (r.probe) {
        const auto& p = *r.probe;
        j["probe"] = {{"supported", p.supported != 0},        {"reason", p.reason},
                      {"device_name", p.device_name},         {"compute_capability", p.compute_capability},
                      {"driver_version", p.driver_version},   {"runtime_version", p.runtime_version},
                      {"total_memory_bytes", p.total_memory_bytes},
                      {"free_memory_bytes", p.free_memory_bytes}};
    }
    return j;
}

nlohmann::json registry_json(const Registry& reg) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : reg.records()) arr.push_back(record_json(r));
    return arr;
}

std::string registry_table(const Registry& reg) {
    std::string out = fmt::format("{:<24} {:<9} {:<6} {:<9} {}\n", "PLUGIN", "VERSION", "DEVICE", "STATUS", "SERVES / REASONS");
    for (const auto& r : reg.records()) {
        if (r.accepted) {
            std::string dev = r.probe && r.probe->device_name[0] ? r.probe->device_name : r.caps.device_kind;
            out += fmt::format("{:<24} {:<9} {:<6} {:<9} {} on {}; types {}; priority {}\n", r.caps.name,
                               r.caps.version, r.caps.device_kind, "accepted", join(r.caps.architectures),
                               dev, join(r.caps.quant_kinds), r.caps.priority);
        } else {
            out += fmt::format("{:<24} {:<9} {:<6} {:<9} {}\n", r.caps.name, r.caps.version.empty() ? "-" : r.caps.version,
                               r.caps.device_kind.empty() ? "-" : r.caps.device_kind, "REJECTED",
                               r.reasons.empty() ? "" : r.reasons.front());
            for (size_t i = 1; i < r.reasons.size(); ++i) out += fmt::format("{:<52}{}\n", "", r.reasons[i]);
        }
    }
    size_t acc = reg.accepted().size();
    out += fmt::format("\n{} accepted, {} rejected\n", acc, reg.records().size() - acc);
    return out;
}

}  // namespace eh::cli
