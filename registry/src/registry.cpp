#include "eh/registry.hpp"

#include <algorithm>

namespace eh {
namespace {

bool contains(const std::vector<std::string>& list, const std::string& item) {
    return std::find(list.begin(), list.end(), item) != list.end();
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += sep;
        out += items[i];
    }
    return out;
}

}  // namespace

void Registry::add(PluginRecord record) { records_.push_back(std::move(record)); }

std::vector<const PluginRecord*> Registry::accepted() const {
    std::vector<const PluginRecord*> out;
    for (const auto& r : records_)
        if (r.accepted) out.push_back(&r);
    return out;
}

std::vector<const PluginRecord*> Registry::rejected() const {
    std::vector<const PluginRecord*> out;
    for (const auto& r : records_)
        if (!r.accepted) out.push_back(&r);
    return out;
}

std::vector<std::string> Registry::shortfalls(const PluginCapabilities& caps,
                                              const ModelRequirements& need) {
    std::vector<std::string> out;
    if (!contains(caps.formats, need.format))
        out.push_back("format " + need.format + " not served (serves " + join(caps.formats) + ")");
    if (!contains(caps.architectures, need.architecture))
        out.push_back("architecture " + need.architecture + " not served (serves " +
                      join(caps.architectures) + ")");
    std::vector<std::string> missing;
    for (const auto& t : need.tensor_types)
        if (!contains(caps.quant_kinds, t) && !contains(missing, t)) missing.push_back(t);
    if (!missing.empty())
        out.push_back("tensor types " + join(missing) + " not served (serves " +
                      join(caps.quant_kinds) + ")");
    return out;
}

Resolution Registry::resolve(const ModelRequirements& need, DevicePolicy policy) const {
    if (policy == DevicePolicy::Auto) {
        // A device plugin that serves the model, even a rejected one, means
        // the model was meant for the GPU: only a device plugin may serve it.
        const bool device_claims = std::any_of(records_.begin(), records_.end(), [&](const PluginRecord& r) {
            return r.caps.device_kind != "cpu" && shortfalls(r.caps, need).empty();
        });
        return resolve(need, device_claims ? DevicePolicy::Device : DevicePolicy::Any);
    }
    auto of_kind = [policy](const PluginRecord& r) {
        if (policy == DevicePolicy::Any) return true;
        return (r.caps.device_kind == "cpu") == (policy == DevicePolicy::Cpu);
    };
    std::vector<const PluginRecord*> fits, claimants;
    std::string offers, would_serve;
    for (const auto& r : records_) {
        if (!of_kind(r)) continue;
        if (!r.accepted) {
            if (policy != DevicePolicy::Any && shortfalls(r.caps, need).empty()) {
                would_serve += "\n  " + r.caps.name + " (rejected): " + join(r.reasons, "; ");
                claimants.push_back(&r);
            }
            continue;
        }
        auto gaps = shortfalls(r.caps, need);
        if (gaps.empty()) {
            fits.push_back(&r);
        } else {
            offers += "\n  " + r.caps.name + ": " + join(gaps, "; ");
        }
    }
    Resolution res;
    if (fits.empty()) {
        res.rejected_claimants = std::move(claimants);
        std::string types = need.tensor_types.empty() ? "none" : join(need.tensor_types);
        const char* which = policy == DevicePolicy::Device ? "no accepted device (GPU) plugin"
                            : policy == DevicePolicy::Cpu  ? "no accepted CPU plugin"
                                                           : "no accepted plugin";
        res.explanation = std::string(which) + " can serve this model (format " + need.format +
                          ", architecture " + need.architecture + ", tensor types " + types + ")";
        if (!would_serve.empty()) res.explanation += "; these would serve it but were rejected:" + would_serve;
        if (!offers.empty())
            res.explanation += (would_serve.empty() ? ":" : "\n  and these were accepted but fall short:") + offers;
        else if (would_serve.empty())
            res.explanation += policy == DevicePolicy::Any ? "; no plugin was accepted" : "; none of that kind was accepted";
        size_t n_rejected = rejected().size();
        if (n_rejected)
            res.explanation += "\n  (" + std::to_string(n_rejected) +
                               " rejected plugin(s): see `engine-host plugins`)";
        return res;
    }
    std::stable_sort(fits.begin(), fits.end(), [](const PluginRecord* a, const PluginRecord* b) {
        if (a->caps.priority != b->caps.priority) return a->caps.priority > b->caps.priority;
        if (a->caps.name != b->caps.name) return a->caps.name < b->caps.name;
        return a->library_path < b->library_path;
    });
    res.plugin = fits.front();
    res.explanation = "plugin " + res.plugin->caps.name + " (priority " +
                      std::to_string(res.plugin->caps.priority) + ")";
    if (fits.size() > 1) {
        res.explanation += " chosen over";
        for (size_t i = 1; i < fits.size(); ++i)
            res.explanation += " " + fits[i]->caps.name + " (priority " +
                               std::to_string(fits[i]->caps.priority) + ")";
    }
    return res;
}

}  // namespace eh
