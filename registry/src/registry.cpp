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

Resolution Registry::resolve(const ModelRequirements& need) const {
    std::vector<const PluginRecord*> fits;
    std::string offers;
    for (const auto& r : records_) {
        if (!r.accepted) continue;
        auto gaps = shortfalls(r.caps, need);
        if (gaps.empty()) {
            fits.push_back(&r);
        } else {
            offers += "\n  " + r.caps.name + ": " + join(gaps, "; ");
        }
    }
    Resolution res;
    if (fits.empty()) {
        std::string types = need.tensor_types.empty() ? "none" : join(need.tensor_types);
        res.explanation = "no accepted plugin can serve this model (format " + need.format +
                          ", architecture " + need.architecture + ", tensor types " + types + ")";
        if (offers.empty())
            res.explanation += "; no plugin was accepted";
        else
            res.explanation += ":" + offers;
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
